"""Bearer-token authentication of the HTTP service.

A request carries one of ``TOOLFLEET_API_TOKENS`` as ``Authorization: Bearer <token>`` or
as ``X-Api-Key: <token>`` (what ``langgraph_sdk.get_client(api_key=...)`` sends). Tokens
are compared in constant time, never logged, and never part of an error message.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from fastapi import HTTPException, Request


class TokenAuth:
    """Checks requests against a set of accepted tokens.

    Args:
        tokens: Accepted tokens; empty turns authentication off (``serve --no-auth``).
    """

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = [t.encode() for t in tokens if t]

    @property
    def enabled(self) -> bool:
        """Whether requests need a token."""
        return bool(self._tokens)

    def accepts(self, token: str | None) -> bool:
        """Whether ``token`` is one of the accepted tokens."""
        if token is None:
            return False
        given = token.encode()
        # Compare against every token: the time taken does not reveal which one matched.
        matched = [hmac.compare_digest(given, known) for known in self._tokens]
        return any(matched)

    def __call__(self, request: Request) -> None:
        """FastAPI dependency: raise 401 unless the request carries an accepted token."""
        if not self.enabled:
            return
        if self.accepts(presented_token(request)):
            return
        raise HTTPException(
            status_code=401,
            detail="missing or invalid API token (send 'Authorization: Bearer <token>')",
            headers={"WWW-Authenticate": "Bearer"},
        )


def presented_token(request: Request) -> str | None:
    """The token a request presents, from ``Authorization: Bearer`` or ``X-Api-Key``."""
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return request.headers.get("x-api-key") or None
