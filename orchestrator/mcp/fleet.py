"""The fleet's tools for an MCP client: listed from the registry, called like an agent's.

A call goes through :class:`~orchestrator.middleware.CeleryToolMiddleware`'s own tool hook,
as a ``create_agent`` agent's call does: the same routing by tool, waiting for a worker,
fair shares per tenant (``toolfleet serve``), signed envelopes, progress events, and
cancellation (the client cancels the request: the hook revokes the call).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime
from mcp.types import INVALID_PARAMS, CallToolResult, Tool, ToolAnnotations

from orchestrator.dispatch.base import Dispatcher
from orchestrator.fairshare import TENANT_KEY
from orchestrator.mcp.results import call_result, error_result
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.tools import RemoteTool
from tool_workers.compat.mcp import error
from tool_workers.contract.errors import ToolfleetError
from tool_workers.contract.models import ToolSpec


class FleetTools:
    """The tools the live workers serve, as MCP tools.

    Args:
        dispatcher: The fleet's dispatcher.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._middleware = CeleryToolMiddleware(dispatcher=dispatcher)

    async def tools(self) -> list[Tool]:
        """Every tool some live worker serves now, by name."""
        served = await self._dispatcher.served_tools_async()
        return [mcp_tool(served[name]) for name in sorted(served)]

    async def has(self, name: str) -> bool:
        """Whether a live worker serves ``name``."""
        return name in await self._dispatcher.served_tools_async()

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        progress: Callable[[Any], None] | None = None,
        tenant: str | None = None,
    ) -> CallToolResult:
        """Run one call on the fleet and return its result (a tool's failure: ``isError``;
        a name no live worker serves: a JSON-RPC invalid-params error, as LangGraph's
        server answers an unknown tool).

        Args:
            name: The tool.
            arguments: Its arguments.
            progress: Gets the call's progress events (from any thread).
            tenant: The tenant whose fair share of calls this one takes.
        """
        served = await self._dispatcher.served_tools_async()
        spec = served.get(name)
        if spec is None:
            raise error(INVALID_PARAMS, f"Unknown tool: {name}")
        call_id = f"mcp-{uuid.uuid4().hex}"
        config: dict[str, Any] = {"configurable": {TENANT_KEY: tenant}} if tenant else {}
        state: dict[str, Any] = {"messages": []}
        runtime = ToolRuntime(
            state=state,
            context=None,
            config=config,  # type: ignore[arg-type]
            stream_writer=progress or _discard,
            tool_call_id=call_id,
            store=None,
        )
        request = ToolCallRequest(
            tool_call={"name": name, "args": dict(arguments), "id": call_id, "type": "tool_call"},
            tool=RemoteTool.from_spec(spec, self._dispatcher),
            state=state,
            runtime=runtime,
        )
        # A task of its own: the MCP server cancels a request through an anyio cancel
        # scope, which would cancel every await of the hook's clean-up (the revocation)
        # as well; the task is cancelled once, and its clean-up awaited to the end.
        task = asyncio.create_task(self._middleware.awrap_tool_call(request, _run_here))
        try:
            output = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([task])
            raise
        except ToolfleetError as exc:
            return error_result(f"Error: the call to {name} failed: {exc}")
        return call_result(output)


async def _run_here(request: ToolCallRequest) -> ToolMessage:
    # A tool placed "local" by the policy: the schema-only tool dispatches it itself.
    assert request.tool is not None
    output = await request.tool.ainvoke(request.tool_call)
    assert isinstance(output, ToolMessage)
    return output


def _discard(_: Any) -> None:
    pass


def mcp_tool(spec: ToolSpec) -> Tool:
    """A registry spec as an MCP tool: its name, description and input schema; its
    idempotency as a hint."""
    schema = dict(spec.parameters or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    idempotent = bool(spec.options.get("idempotent", True))
    return Tool(
        name=spec.name,
        description=spec.description or spec.name,
        inputSchema=schema,
        annotations=ToolAnnotations(idempotentHint=idempotent, openWorldHint=True),
    )
