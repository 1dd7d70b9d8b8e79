"""An MCP server over a source of tools; ``toolfleet mcp`` serves the fleet's on stdio.

The server is MCP's low-level ``Server``: the tool list is read when a client asks (the
fleet's tools come and go with its workers), and a call's progress events go back as
notifications when the client sent a progress token.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import Any, Protocol

from mcp.types import INVALID_PARAMS, CallToolResult, Tool

from orchestrator.jsonvalue import check_encodable
from orchestrator.mcp.fleet import FleetTools
from orchestrator.mcp.results import ProgressRelay
from tool_workers.compat.mcp import RequestContext, error, lowlevel_server
from tool_workers.contract.settings import Settings


class ToolSource(Protocol):
    """What the MCP server offers: tools to list and call.

    ``request`` is the HTTP request a call came in (``None`` on stdio).
    """

    async def tools(self, request: Any) -> list[Tool]:
        """The tools offered to the client of ``request``."""
        ...

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        progress: Callable[[Any], None] | None,
        request: Any,
    ) -> CallToolResult:
        """Run one call for the client of ``request``."""
        ...


def build_server(source: ToolSource) -> Any:
    """An MCP server (the SDK's low-level ``Server``) offering ``source``'s tools.

    A call's arguments are checked against the tool's schema where the tool runs (the
    worker's model); here only that they are JSON every part of the fleet can carry
    (:func:`~orchestrator.jsonvalue.check_encodable`), or the call is answered with a
    JSON-RPC invalid-params error. ``source.call`` may raise
    :func:`tool_workers.compat.mcp.error`'s exception to answer with a JSON-RPC error.
    """

    async def list_tools(context: RequestContext) -> list[Tool]:
        return await source.tools(context.request)

    async def call_tool(
        context: RequestContext, name: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        try:
            check_encodable(arguments)
        except ValueError as exc:
            raise error(INVALID_PARAMS, f"Invalid arguments for tool {name}: {exc}") from None
        token = context.progress_token
        async with _relay(context.session, token, context.request_id) as progress:
            return await source.call(name, arguments, progress, context.request)

    return lowlevel_server("toolfleet", version("toolfleet"), list_tools, call_tool)


@contextlib.asynccontextmanager
async def _relay(
    session: Any, token: str | int | None, request_id: Any
) -> AsyncIterator[ProgressRelay | None]:
    if token is None:
        yield None
        return
    async with ProgressRelay(session, token, request_id) as relay:
        yield relay


class FleetSource:
    """The fleet's tools as a :class:`ToolSource` (the same for every client)."""

    def __init__(self, fleet: FleetTools) -> None:
        self._fleet = fleet

    async def tools(self, request: Any) -> list[Tool]:
        return await self._fleet.tools()

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        progress: Callable[[Any], None] | None,
        request: Any,
    ) -> CallToolResult:
        return await self._fleet.call(name, arguments, progress=progress)


def serve_stdio(settings: Settings) -> None:
    """Offer the fleet's tools on stdin/stdout until the client closes them."""
    import anyio
    from mcp.server.stdio import stdio_server

    from orchestrator.dispatch.fleet import dispatcher_for

    dispatcher = dispatcher_for(settings=settings)
    server = build_server(FleetSource(FleetTools(dispatcher)))

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(run)
    finally:
        dispatcher.close()
