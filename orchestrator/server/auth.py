"""Bearer-token authentication of the HTTP service, and the tenant each token belongs to.

A request carries one of ``TOOLFLEET_API_TOKENS`` as ``Authorization: Bearer <token>`` or
as ``X-Api-Key: <token>`` (what ``langgraph_sdk.get_client(api_key=...)`` sends). Tokens
are compared in constant time, never logged, and never part of an error message.

Each token is a *tenant*: the threads and runs it creates are its own (see
:mod:`orchestrator.server.tenancy`). An entry ``name:token`` puts the token in the named
tenant ``name``, so ``team-a:T1,team-a:T2,T3`` makes two tenants: ``team-a`` (two tokens)
and the one of ``T3``. A bare token's tenant id is a keyed hash of it
(``tk-<24 hex digits>``): it shows up in Redis keys and log lines, and must not give the
token away. The key is the deployment's (:func:`orchestrator.server.tenancy.tenant_key`),
so every replica derives the same ids.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping

from tool_workers.contract.errors import ConfigError

ANONYMOUS = "anonymous"
"""The one tenant of a server without tokens (``serve --no-auth``)."""

HASHED_PREFIX = "tk-"
"""How a tenant id made from a bare token starts (no named tenant may)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class TokenAuth:
    """Checks tokens against the accepted ones and names the tenant of each.

    Args:
        entries: Accepted tokens, each bare or as ``tenant:token``; empty turns
            authentication off (``serve --no-auth``: every request is the anonymous tenant).

    Raises:
        ConfigError: a tenant name is not 1-64 letters, digits, ``_``, ``.``, ``-``, or is
            reserved (``anonymous``, or starting with ``tk-``).
    """

    def __init__(self, entries: Iterable[str]) -> None:
        self._tokens: list[tuple[bytes, str | None]] = []
        for entry in entries:
            name, sep, token = entry.partition(":")
            if not sep:
                name, token = "", entry
            if not token:
                continue
            if sep and (
                not _NAME.fullmatch(name) or name == ANONYMOUS or name.startswith(HASHED_PREFIX)
            ):
                # The name may be a token's first part: it is never echoed.
                raise ConfigError(
                    "an entry of TOOLFLEET_API_TOKENS has an invalid tenant name (1-64 "
                    "letters, digits, '_', '.', '-'; not 'anonymous', not starting 'tk-')"
                )
            self._tokens.append((token.encode(), name or None))
        self._key: bytes | None = None

    @property
    def enabled(self) -> bool:
        """Whether requests need a token."""
        return bool(self._tokens)

    @property
    def tenants(self) -> int:
        """How many tenants the tokens make."""
        return len({name or token for token, name in self._tokens})

    def bind(self, key: bytes) -> None:
        """Set the deployment's key that bare tokens' tenant ids are hashed with."""
        self._key = key

    def accepts(self, token: str | None) -> bool:
        """Whether ``token`` is one of the accepted tokens."""
        return self._match(token) is not None

    def tenant(self, token: str | None) -> str | None:
        """The tenant of ``token``; ``None`` if it is not accepted.

        Raises:
            RuntimeError: a bare token matched before :meth:`bind` gave the key.
        """
        if not self.enabled:
            return ANONYMOUS
        matched = self._match(token)
        if matched is None:
            return None
        known, name = matched
        if name is not None:
            return name
        if self._key is None:
            raise RuntimeError("tenant key not loaded yet")
        digest = hmac.new(self._key, known, hashlib.sha256).hexdigest()
        return f"{HASHED_PREFIX}{digest[:24]}"

    def _match(self, token: str | None) -> tuple[bytes, str | None] | None:
        if not token:
            return None
        given = token.encode()
        # Compare against every token: the time taken does not reveal which one matched.
        found: tuple[bytes, str | None] | None = None
        for known, name in self._tokens:
            if hmac.compare_digest(given, known) and found is None:
                found = (known, name)
        return found


def presented_token(headers: Mapping[str, str]) -> str | None:
    """The token a request presents, from ``Authorization: Bearer`` or ``X-Api-Key``.

    Args:
        headers: The request's headers, names in lower case.
    """
    header = headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return headers.get("x-api-key") or None
