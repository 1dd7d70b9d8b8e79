"""One masking for every setting, argument or line toolfleet prints or logs.

Both sides import it: the worker's start banner and log formats, Flower's view of a
call's arguments (:mod:`tool_workers.celery_ext.redaction`), ``toolfleet serve``'s
startup log and the CLI's error lines. The rules, applied at any depth:

- a value under a secret-looking name (:data:`SECRET_NAMES`: ``password``, ``token``,
  ``api_key``, ``Authorization``, ...) is :data:`MASK` (an unset one stays as it is);
- every value of a ``headers`` or ``env`` map is :data:`MASK`, whatever its name (an
  MCP server's ``env`` holds keys under any name; a header may be a custom token);
- a string holding a JSON object or array (an inline ``TOOLFLEET_MCP_SERVERS``) is
  masked as the structure it is and written back as JSON;
- in any other text, the password of a ``scheme://user:password@`` URL and the token
  after ``Bearer`` are :data:`MASK`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tool_workers.contract.settings import Settings

__all__ = [
    "MASK",
    "SECRET_NAMES",
    "WHOLLY_MASKED",
    "mask_secrets",
    "mask_text",
    "mask_value",
    "masked_settings",
]

MASK = "***"

SECRET_NAMES = re.compile(
    r"pass(word|wd|phrase)?|secret|token|api[-_]?key|signing[-_]?key|auth|credential|cookie"
    r"|private|session",
    re.IGNORECASE,
)
"""Names whose values are never shown (matched anywhere in the name)."""

WHOLLY_MASKED = frozenset({"headers", "env"})
"""Names of maps every value of which is masked."""

# A run of characters that can end in the ``@`` of a userinfo: no ``@``, no whitespace.
_UNTIL_AT = re.compile(r"[^@\s]+")
_BEARER = re.compile(r"(\bBearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def _masked_bearer(match: re.Match[str]) -> str:
    # A function, not a "\g<1>" template: re looks a template up on every call.
    return match.group(1) + MASK


def mask_text(text: str) -> str:
    """``text`` with URL passwords (:func:`mask_secrets`) and bearer tokens masked: what a
    log line or an error message goes through before it is written."""
    return _BEARER.sub(_masked_bearer, mask_secrets(text))


def mask_value(value: Any, name: str = "") -> Any:
    """``value`` (a decoded JSON-like structure, or a string) as it may be shown.

    Args:
        value: A dict, list, tuple, string or scalar.
        name: The name ``value`` is held under (a field, a key), if any.
    """
    if name and SECRET_NAMES.search(name) and value not in (None, "", [], (), {}):
        return MASK
    if isinstance(value, Mapping):
        if name.lower() in WHOLLY_MASKED:
            return {str(k): MASK for k in value}
        return {str(k): mask_value(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_value(v) for v in value]
    if isinstance(value, str):
        return _mask_string(value)
    return value


def _mask_string(text: str) -> str:
    if text[:1] in "{[":
        try:
            decoded = json.loads(text)
        except ValueError:
            pass
        else:
            if isinstance(decoded, (dict, list)):
                return json.dumps(mask_value(decoded), separators=(",", ":"))
    return mask_text(text)


def masked_settings(settings: Settings) -> dict[str, Any]:
    """The settings as they may be printed or logged: each field through
    :func:`mask_value` under its own name, lists as comma-separated text.

    Fields excluded from ``model_dump`` (API tokens, the signing key, the webhook
    secret) are left out altogether.
    """
    fields: dict[str, Any] = {}
    for name, value in settings.model_dump(mode="json").items():
        shown = mask_value(value, name)
        if isinstance(shown, list):
            shown = ",".join(str(v) for v in shown)
        fields[name] = shown
    return fields


def mask_secrets(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it as ``***``.

    User names stay (they help debugging); works on a bare URL and on a log line alike.
    The scheme is an ASCII letter and then word characters, ``+``, ``.`` or ``-``; the
    user has no ``:``, ``/`` or ``@``; the password is what follows up to the next ``@``.

    Linear in the length of ``text``: a log line can carry a caller's long ids, and the
    one-regex form of this (scheme, user and password in one pattern) rescans a long
    word from each of its characters.
    """
    if "@" not in text:  # no password without the "@" that ends it
        return text
    out: list[str] = []
    done = 0
    for run in _UNTIL_AT.finditer(text):
        # A password ends at an "@": only a run followed by one can hold it.
        if text[run.end() : run.end() + 1] != "@":
            continue
        cut = _password_start(run.group())
        if cut is not None:
            out.append(text[done : run.start() + cut])
            out.append("***")
            done = run.end()
    out.append(text[done:])
    return "".join(out)


def _is_scheme_char(char: str) -> bool:
    return char.isalnum() or char in "_+.-"


def _password_start(run: str) -> int | None:
    """Where the password starts in ``run`` (text up to an "@"), or ``None`` if it has none.

    Each ``://`` is tried from the left. Its scheme is the run of scheme characters just
    before it, from its first ASCII letter; its user runs up to the first ``:`` or ``/``,
    which must be a ``:`` followed by at least one character. Each scan stops at a ``:``
    or ``/``, so every character is looked at a bounded number of times.
    """
    at = run.find("://")
    while at >= 0:
        start = at
        while start > 0 and _is_scheme_char(run[start - 1]):
            start -= 1
        has_letter = any(c.isascii() and c.isalpha() for c in run[start:at])
        end = at + 3
        while end < len(run) and run[end] not in ":/":
            end += 1
        if has_letter and end + 1 < len(run) and run[end] == ":":
            return end + 1
        at = run.find("://", at + 1)
    return None
