"""The first thing every request meets: size limits and the token, before any body is read.

A pure ASGI middleware in front of the FastAPI app, so a request that is too large or
carries no valid token costs the server a few header comparisons and nothing more::

    request line + headers --> URL longer than MAX_URL_BYTES ------------> 414
                           --> headers larger than MAX_HEADER_BYTES -----> 431
                           --> no valid token (paths other than PUBLIC) -> 401
                           --> Content-Length over the body limit -------> 413
    body, chunk by chunk   --> more bytes than the body limit -----------> 413 (reading stops)
                           --> not all in within the body timeout -------> 408 (reading stops)
                           --> declared neither JSON nor text -----------> 415
    the app                <-- the body, replayed; the tenant in scope["state"]["tenant"]

The body is read by the middleware only after the token is checked, and only up to
``TOOLFLEET_MAX_BODY_BYTES``: a client streaming more is cut off at the limit, whatever
its ``Content-Length`` says, and one that has not sent all of it within
``TOOLFLEET_HTTP_BODY_TIMEOUT`` seconds gets a 408. (The request head has a deadline of
its own, before the request reaches this middleware:
:mod:`orchestrator.server.connections`.) Error responses carry ``Connection: close``, so an unread
body never reaches the next request on the connection.

Every body is JSON. One declared as text (``text/plain``, what a browser's ``fetch`` sends
for a string body, and so what Agent Chat UI's proxy sends) or not declared at all reaches
the app declared as JSON, as LangGraph's server reads it; a form or any other media type
is a 415.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from orchestrator.server.auth import TokenAuth, presented_token

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_URL_BYTES = 8_192
"""Longest path plus query string accepted (414 beyond)."""

MAX_HEADER_BYTES = 8_192
"""Largest sum of header names and values accepted (431 beyond)."""

PUBLIC = frozenset(
    {"/ok", "/ready", "/info", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc"}
)
"""Paths served without a token (probes, metrics, the API documentation); plus
``/openapi.json``."""


class Guard:
    """ASGI middleware enforcing the size limits and the token.

    Args:
        app: The application behind it.
        auth: The accepted tokens and their tenants.
        max_body_bytes: Largest request body accepted (``TOOLFLEET_MAX_BODY_BYTES``).
        body_timeout: Seconds the whole body may take to arrive
            (``TOOLFLEET_HTTP_BODY_TIMEOUT``).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: TokenAuth,
        max_body_bytes: int,
        body_timeout: float = 30.0,
    ) -> None:
        self._app = app
        self._auth = auth
        self._max_body = max_body_bytes
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request; pass it on with its body replayed, or answer the refusal."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path: bytes = scope.get("raw_path") or scope["path"].encode()
        if len(path) + len(scope.get("query_string", b"")) > MAX_URL_BYTES:
            await _refuse(send, 414, f"URL longer than {MAX_URL_BYTES} bytes")
            return
        raw_headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if sum(len(name) + len(value) for name, value in raw_headers) > MAX_HEADER_BYTES:
            await _refuse(send, 431, f"headers larger than {MAX_HEADER_BYTES} bytes")
            return
        headers = {name.decode("latin-1").lower(): v.decode("latin-1") for name, v in raw_headers}
        tenant = self._tenant(scope["path"], headers)
        if tenant is None:
            await _refuse(
                send,
                401,
                "missing or invalid API token (send 'Authorization: Bearer <token>')",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        scope.setdefault("state", {})["tenant"] = tenant
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body:
            await _refuse(send, 413, f"request body larger than {self._max_body} bytes")
            return
        try:
            async with asyncio.timeout(self._body_timeout):
                body = await self._read_body(receive)
        except TimeoutError:
            await _refuse(send, 408, f"request body not received within {self._body_timeout:g} s")
            return
        if body is None:
            await _refuse(send, 413, f"request body larger than {self._max_body} bytes")
            return
        if body:
            declared_json = as_json(raw_headers)
            if declared_json is None:
                await _refuse(
                    send,
                    415,
                    f"request body of type {headers['content-type'][:100]!r}: send JSON "
                    "(Content-Type: application/json)",
                )
                return
            scope["headers"] = declared_json
        await self._app(scope, replay(body, receive), send)

    def _tenant(self, path: str, headers: dict[str, str]) -> str | None:
        if path in PUBLIC or path == "/openapi.json":
            return ""
        return self._auth.tenant(presented_token(headers))

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or ``None`` as soon as it exceeds the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to serve
                return b""
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def as_json(raw_headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]] | None:
    """``raw_headers`` with a body declared as JSON, if it is JSON, text or undeclared;
    ``None`` for any other media type."""
    declared = [v for name, v in raw_headers if name.lower() == b"content-type"]
    media = declared[0].split(b";")[0].strip().lower() if declared else b""
    kind, _, subtype = media.partition(b"/")
    if kind == b"application" and (subtype == b"json" or subtype.endswith(b"+json")):
        return raw_headers
    if media and kind != b"text":
        return None
    rest = [(name, v) for name, v in raw_headers if name.lower() != b"content-type"]
    return [*rest, (b"content-type", b"application/json")]


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body once, then the client's own messages (a
    disconnect, which a long ``/wait`` watches for)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(
    send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    payload = orjson.dumps({"detail": detail})
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
