"""A remote call's LangChain tool run: the callbacks a local tool would fire, fired here.

A local tool reports itself to the run's callback handlers (tracers such as LangSmith's
or Langfuse's, any ``BaseCallbackHandler`` in ``config["callbacks"]`` or configured
globally) from ``BaseTool.run``: ``on_tool_start`` with its name, description and input,
then ``on_tool_end`` with its ToolMessage or ``on_tool_error``. A call the workers run
never enters ``BaseTool.run`` on the orchestrator, so the tool hooks report it the same
way, with the run's tags and metadata, from the call's own config.

A tool's failure that a local tool would raise (a tool error, arguments failing the
schema, a time limit) is reported with ``on_tool_error`` and a :class:`RemoteToolError`
carrying the text the model reads, before the error ToolMessage goes into state, as
ToolNode does for a local tool.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForToolRun,
    CallbackManager,
    CallbackManagerForToolRun,
)
from langchain_core.messages import ToolMessage
from langchain_core.tools import ToolException
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from orchestrator.calls import PreparedCall


class RemoteToolError(ToolException):
    """Reported to callback handlers when a remote tool failed; its text is the model's."""


def _config(request: ToolCallRequest) -> dict[str, Any]:
    return dict(request.runtime.config or {}) if request.runtime is not None else {}


def _start_arguments(request: ToolCallRequest, call: PreparedCall) -> dict[str, Any]:
    config = _config(request)
    description = call.spec.description if call.spec is not None else ""
    if request.tool is not None:
        description = request.tool.description or description
    return {
        "serialized": {"name": call.tool, "description": description},
        "input_str": str(call.args),
        "name": config.get("run_name"),
        "run_id": config.get("run_id"),
        "inputs": dict(call.args),
        "tool_call_id": call.call_id,
    }


def _configure_args(request: ToolCallRequest) -> tuple[Any, ...]:
    config = _config(request)
    return (config.get("callbacks"), None, False, config.get("tags"), None, config.get("metadata"))


def start_tool_run(request: ToolCallRequest, call: PreparedCall) -> CallbackManagerForToolRun:
    """Tell the run's handlers the tool started (``on_tool_start``); its run manager."""
    manager = CallbackManager.configure(*_configure_args(request))
    arguments = _start_arguments(request, call)
    return manager.on_tool_start(
        arguments.pop("serialized"), arguments.pop("input_str"), **arguments
    )


async def astart_tool_run(
    request: ToolCallRequest, call: PreparedCall
) -> AsyncCallbackManagerForToolRun:
    """Async flavour of :func:`start_tool_run`."""
    manager = AsyncCallbackManager.configure(*_configure_args(request))
    arguments = _start_arguments(request, call)
    return await manager.on_tool_start(
        arguments.pop("serialized"), arguments.pop("input_str"), **arguments
    )


def _failure(output: ToolMessage | Command[Any]) -> RemoteToolError | None:
    """What a local tool would have raised for this output, if anything."""
    if not isinstance(output, ToolMessage) or output.status != "error":
        return None
    meta = output.response_metadata.get("toolfleet") or {}
    return RemoteToolError(str(output.content)) if meta.get("error_kind") else None


def end_tool_run(
    run: CallbackManagerForToolRun, call: PreparedCall, output: ToolMessage | Command[Any]
) -> None:
    """Tell the handlers how the call ended: its output, or the error a local tool raised."""
    failure = _failure(output)
    if failure is not None:
        run.on_tool_error(failure, tool_call_id=call.call_id)
    else:
        run.on_tool_end(output, name=call.tool)


async def aend_tool_run(
    run: AsyncCallbackManagerForToolRun, call: PreparedCall, output: ToolMessage | Command[Any]
) -> None:
    """Async flavour of :func:`end_tool_run`."""
    failure = _failure(output)
    if failure is not None:
        await run.on_tool_error(failure, tool_call_id=call.call_id)
    else:
        await run.on_tool_end(output, name=call.tool)
