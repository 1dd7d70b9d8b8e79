"""The names of the ``mcp`` SDK that differ between its majors (1.24+ and 2.x).

Everything else toolfleet uses of the SDK (``ClientSession``, ``stdio_client``,
``streamable_http_client``, ``stdio_server``, the session manager of streamable HTTP, the
content types) is the same in both. What differs goes through here:

- the error a JSON-RPC error arrives as: ``McpError(ErrorData)`` in 1.x, ``MCPError(code,
  message)`` in 2.x (:data:`McpError`, :func:`error`);
- ``streamable_http_client``: it takes httpx's client and yields three items in 1.x,
  httpx2's client and two items in 2.x (:func:`streamable_http`);
- the low-level ``Server``: handlers registered by decorators in 1.x, given to the
  constructor in 2.x (:func:`lowlevel_server`);
- the models' attributes: camelCase in 1.x, snake_case in 2.x; both dump by alias to the
  protocol's own (camelCase) names, which is how toolfleet reads them (:func:`wire`).

Imported only where the ``mcp`` extra is in use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import anyio
import mcp
import mcp.client.streamable_http
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.types import CallToolRequest, CallToolResult, ListToolsResult, Tool

MAJOR = int(version("mcp").split(".", 1)[0])
"""The installed SDK's major version."""

McpError: type[Exception] = getattr(mcp, "MCPError", None) or mcp.McpError
"""The exception a JSON-RPC error answer arrives as; its ``error`` is the ``ErrorData``."""

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "streamable_http_client": (
        mcp.client.streamable_http,
        "streamable_http_client",
        ("url", "http_client"),
    ),
    "StreamableHTTPSessionManager": (StreamableHTTPSessionManager, "__init__", ("self", "app")),
    "ClientSession.list_tools(params=)": (mcp.ClientSession, "list_tools", ()),
    "Server.__init__": (Server, "__init__", ("self", "name", "version")),
    **(
        {"Server(on_list_tools=, on_call_tool=)": (Server, "get_request_handler", ("self",))}
        if MAJOR >= 2
        else {
            "Server.list_tools": (Server, "list_tools", ("self",)),
            "Server.request_handlers": (Server, "request_handlers", ()),
        }
    ),
}
"""The names of the installed major this module relies on (all public: the differences
between majors are what it hides). Its behaviour under either is pinned by
``tests/unit/test_mcp_compat.py``."""


def error(code: int, message: str) -> Exception:
    """The exception a server handler raises to answer with a JSON-RPC error."""
    if MAJOR >= 2:
        return McpError(code, message)
    from mcp.types import ErrorData

    return McpError(ErrorData(code=code, message=message))


def error_data(exc: BaseException) -> tuple[int, str]:
    """The code and message of a :data:`McpError`."""
    data = exc.error  # type: ignore[attr-defined]
    return int(data.code), str(data.message)


@asynccontextmanager
async def streamable_http(
    url: str, headers: Mapping[str, str] | None, *, timeout: float, read: float
) -> AsyncIterator[tuple[Any, Any]]:
    """The read and write streams of a streamable HTTP client session with ``url``.

    ``streamable_http_client`` takes httpx's client in 1.x and httpx2's in 2.x, and
    yields a session-id getter as a third item in 1.x only.
    """
    if MAJOR >= 2:
        import httpx2 as http
    else:
        import httpx as http  # type: ignore[no-redef]
    # Made off the event loop: a client loads its TLS certificates (and httpx2 imports
    # its transport, reading package metadata) when it is made, blocking reads both.
    client: Any = await anyio.to_thread.run_sync(
        lambda: http.AsyncClient(headers=headers, timeout=http.Timeout(timeout, read=read))
    )
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams[0], streams[1]


def wire(model: Any) -> dict[str, Any]:
    """An SDK model as the protocol names it (camelCase), under either major."""
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


@dataclass(frozen=True)
class RequestContext:
    """What a server handler needs of the request it answers."""

    session: Any
    """The server session (for progress notifications)."""
    request_id: str | int | None
    progress_token: str | int | None
    """The client's progress token (``None``: it wants no progress)."""
    request: Any
    """The HTTP request it came in (``None`` on stdio)."""


ListTools = Callable[[RequestContext], Awaitable[list[Tool]]]
CallTool = Callable[[RequestContext, str, dict[str, Any]], Awaitable[CallToolResult]]


def lowlevel_server(
    name: str, server_version: str, list_tools: ListTools, call_tool: CallTool
) -> Any:
    """A low-level MCP server answering ``tools/list`` and ``tools/call`` with these.

    ``call_tool`` may raise :func:`error`'s exception: the client gets that JSON-RPC
    error (under 1.x too, where the ``call_tool`` decorator would turn it into an
    ``isError`` result; the handler is registered for the request type instead).
    Arguments are not checked against the tool's schema here.
    """
    if MAJOR >= 2:

        async def on_list_tools(ctx: Any, params: Any) -> ListToolsResult:
            return ListToolsResult(tools=await list_tools(_context(ctx)))

        async def on_call_tool(ctx: Any, params: Any) -> CallToolResult:
            return await call_tool(_context(ctx), params.name, dict(params.arguments or {}))

        return Server(  # type: ignore[call-arg]
            name, version=server_version, on_list_tools=on_list_tools, on_call_tool=on_call_tool
        )

    server: Any = Server(name, version=server_version)

    @server.list_tools()  # type: ignore[untyped-decorator,misc,unused-ignore]
    async def listed() -> list[Tool]:
        return await list_tools(_context(server.request_context))

    async def called(request: CallToolRequest) -> Any:
        from mcp.types import ServerResult

        params = request.params
        context = _context(server.request_context)
        result = await call_tool(context, params.name, dict(params.arguments or {}))
        return ServerResult(result)  # type: ignore[call-arg,unused-ignore]

    server.request_handlers[CallToolRequest] = called
    return server


def _context(ctx: Any) -> RequestContext:
    meta = ctx.meta
    if meta is None:
        token = None
    elif isinstance(meta, Mapping):  # 2.x: a TypedDict
        token = meta.get("progress_token", meta.get("progressToken"))
    else:
        token = getattr(meta, "progressToken", None)
    return RequestContext(
        session=ctx.session, request_id=ctx.request_id, progress_token=token, request=ctx.request
    )


def stateless_http(server: Any) -> Any:
    """A session manager serving ``server`` over streamable HTTP, each request a session
    of its own (``async with manager.run(): await manager.handle_request(...)``)."""
    return StreamableHTTPSessionManager(app=server, json_response=False, stateless=True)
