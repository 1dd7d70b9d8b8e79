"""Refuse to start with a placeholder where a secret belongs.

A deployment copied from an example (``change-me`` passwords and tokens) passes every
"is it set?" check and runs wide open. Each toolfleet process therefore checks the
secrets it reads, once at start, against the placeholders such examples use, and stops
with one line naming the variable. The value itself is never printed.

Checked: the passwords in ``TOOLFLEET_BROKER_URL``, ``TOOLFLEET_RESULT_BACKEND``,
``TOOLFLEET_DATABASE_URL`` and ``TOOLFLEET_STORE_URL``; every ``TOOLFLEET_API_TOKENS``
token; ``TOOLFLEET_SIGNING_KEY``; the passwords of ``FLOWER_BASIC_AUTH``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from urllib.parse import unquote, urlsplit

from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import Settings

PLACEHOLDERS = frozenset(
    {
        "change-me",
        "changeme",
        "change_me",
        "change-me-to-a-long-random-hex-string",
        "changeit",
        "password",
        "passwd",
        "secret",
        "token",
        "admin",
        "example",
        "xxx",
        "todo",
        "fixme",
        "replace-me",
        "your-password",
        "your-token",
    }
)
"""Values that are known to be placeholders (compared case-insensitively)."""

_PLACEHOLDER_PREFIX = re.compile(r"^(change|replace)[-_ ]?(me|this|it)\b")
"""Any value starting like one (``change-me-too``, ``CHANGEME_SOON``) is one as well."""

_URL_SETTINGS = {
    "broker_url": "TOOLFLEET_BROKER_URL",
    "result_backend": "TOOLFLEET_RESULT_BACKEND",
    "redis_url": "TOOLFLEET_REDIS_URL",
    "database_url": "TOOLFLEET_DATABASE_URL",
    "store_url": "TOOLFLEET_STORE_URL",
}


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is a placeholder rather than a secret of its own."""
    text = value.strip().lower()
    return text in PLACEHOLDERS or bool(_PLACEHOLDER_PREFIX.match(text))


def _url_password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:  # not a URL: the settings' own validation reports it
        return None
    return unquote(password) if password else None


def placeholder_variables(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> Iterator[str]:
    """The variables holding a placeholder, each described in a few words.

    Args:
        settings: The process's settings (URLs and API tokens).
        environ: The process environment, for ``FLOWER_BASIC_AUTH`` (Flower reads it
            itself); omitted, it is not checked.
    """
    for field, variable in _URL_SETTINGS.items():
        url = getattr(settings, field)
        password = _url_password(url) if url else None
        if password is not None and is_placeholder(password):
            hint = " (REDIS_PASSWORD in docker compose)" if field == "broker_url" else ""
            yield f"the password in {variable}{hint}"
    if any(is_placeholder(token) for token in settings.api_tokens):
        yield "a token in TOOLFLEET_API_TOKENS"
    if settings.signing_key is not None and is_placeholder(settings.signing_key):
        yield "TOOLFLEET_SIGNING_KEY"
    if settings.webhook_secret is not None and is_placeholder(settings.webhook_secret):
        yield "TOOLFLEET_WEBHOOK_SECRET"
    logins = (environ or {}).get("FLOWER_BASIC_AUTH", "")
    for login in filter(None, (part.strip() for part in logins.split(","))):
        _, _, password = login.partition(":")
        if is_placeholder(password):
            yield "a password in FLOWER_BASIC_AUTH"
            break


def refuse_placeholders(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Raise unless every secret the process reads is a value of its own.

    Raises:
        ConfigError: naming each variable that holds a placeholder.
    """
    found = list(placeholder_variables(settings, environ))
    if found:
        raise ConfigError(
            f"refusing to start: {', '.join(found)} is a placeholder; set a secret of your "
            "own (e.g. openssl rand -hex 32)"
        )
