"""The graph context a remote tool asks for, rebuilt on the worker.

LangGraph injects some tool arguments from the graph instead of the model:
``InjectedState`` (state fields), ``ToolRuntime`` (state, context, config, store, stream
writer), ``InjectedStore`` and ``InjectedToolCallId``. The orchestrator sends the state
fields and context a tool declared (as JSON, never the whole message history unless the
tool names it); the worker rebuilds the arguments here, with its own store and a stream
writer that publishes progress back to the orchestrator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolRuntime
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore

from tool_workers.compat import langgraph as langgraph_compat
from tool_workers.contract.models import InjectedArgs, ToolRequest
from tool_workers.contract.wire_json import from_wire

CONFIG_WHITELIST = ("thread_id", "run_id", "tags", "metadata", "checkpoint_ns")
"""Keys of the run's config a remote tool sees (in ``ToolRuntime.config``)."""


class MissingContextError(ValueError):
    """Raised when a tool needs graph context the call does not carry (names what)."""


@dataclass
class WorkerGraph:
    """What this worker process gives calls beyond their arguments."""

    store: BaseStore | None = None
    write: Callable[[Any], None] | None = None


_INJECTED: dict[int, tuple[BaseTool, InjectedArgs]] = {}
"""Injected arguments by tool (reflection on type hints: once per tool, not per call)."""


def injected_args_of(tool: BaseTool) -> InjectedArgs:
    """The arguments LangGraph would inject into ``tool``."""
    cached = _INJECTED.get(id(tool))
    if cached is not None and cached[0] is tool:
        return cached[1]
    found = langgraph_compat.injected_params(tool)
    args = InjectedArgs(state=found.state, store=found.store, runtime=found.runtime)
    _INJECTED[id(tool)] = (tool, args)
    return args


def _no_write(_: Any) -> None:
    pass


def invoke_config(request: ToolRequest, graph: WorkerGraph) -> RunnableConfig:
    """The config a worker invokes a tool with: ``get_stream_writer()`` and the whitelist."""
    sent = request.injected.config if request.injected else {}
    context = from_wire(request.injected.context) if request.injected else None
    runtime = Runtime(context=context, store=graph.store, stream_writer=graph.write or _no_write)
    configurable = {k: v for k, v in sent.items() if k in ("thread_id", "run_id", "checkpoint_ns")}
    config: RunnableConfig = {"configurable": langgraph_compat.with_runtime(configurable, runtime)}
    if "tags" in sent:
        config["tags"] = sent["tags"]
    if "metadata" in sent:
        config["metadata"] = sent["metadata"]
    return config


def inject(
    tool: BaseTool, request: ToolRequest, graph: WorkerGraph, config: RunnableConfig
) -> dict[str, Any]:
    """The call's arguments with the injected ones added (any sent by the model dropped).

    Raises:
        MissingContextError: the tool needs a store this worker has none of, or a state
            field the call did not carry.
    """
    wanted = injected_args_of(tool)
    args = dict(request.args)
    if not wanted.any:
        return args
    for name in (*wanted.state, wanted.store, wanted.runtime):
        if name:
            args.pop(name, None)  # never from the model
    state = from_wire(request.injected.state) if request.injected else {}
    for arg, field in wanted.state.items():
        if field is None:
            args[arg] = state
        elif field in state:
            args[arg] = state[field]
        else:
            raise MissingContextError(f"state field {field!r} (argument {arg!r}) was not sent")
    if wanted.store:
        if graph.store is None:
            raise MissingContextError(
                f"the tool needs a store (argument {wanted.store!r}) and this worker has none: "
                "set TOOLFLEET_STORE_URL"
            )
        args[wanted.store] = graph.store
    if wanted.runtime:
        args[wanted.runtime] = ToolRuntime(
            state=state,
            context=langgraph_compat.runtime_of(config).context,
            config=cast(
                RunnableConfig,
                {k: v for k, v in config.items() if k != "configurable"}
                | {
                    "configurable": {
                        k: v for k, v in config["configurable"].items() if k in CONFIG_WHITELIST
                    }
                },
            ),
            stream_writer=graph.write or _no_write,
            tool_call_id=request.call_id,
            store=graph.store,
            tools=[],
        )
    return args
