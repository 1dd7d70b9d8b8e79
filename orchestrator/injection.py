"""The graph context a remote call carries, and a remote ``Command`` brought back.

The orchestrator sends a remote tool only what it declared: the state fields named by
its ``InjectedState`` arguments (never the message history unless the orchestrator's
policy sets ``inject_messages`` for the tool: it grows with every turn, and a worker's
registry entry must not be able to ask for it),
the run's ``context``, and a whitelist of the run's config. Values that cannot be JSON
are refused with an error naming the field.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from tool_workers.contract.models import Injected, ToolSpec
from tool_workers.contract.wire_json import from_wire, to_wire


def injected_for(spec: ToolSpec, request: ToolCallRequest) -> Injected | None:
    """What the call must carry for the tool's injected arguments (``None``: nothing).

    Raises:
        NotJSONError: a value the tool needs cannot be JSON (the message names it).
    """
    wanted = spec.injected
    if not wanted.any:
        return None
    state = _state_dict(request.state)
    fields: dict[str, Any] = {}
    # The orchestrator's policy alone decides this (the registry view puts it in the spec
    # it routes with); what a worker declares cannot ask for the history.
    with_history = bool(spec.options.get("inject_messages"))
    if wanted.runtime or any(field is None for field in wanted.state.values()):
        fields.update({k: v for k, v in state.items() if k != "messages" or with_history})
    for field in wanted.state.values():
        if field is not None and field in state and (field != "messages" or with_history):
            fields[field] = state[field]
    runtime = request.runtime
    context = getattr(runtime, "context", None) if runtime is not None else None
    return Injected(
        state=to_wire(fields, "state"),
        context=to_wire(context, "context") if wanted.runtime else None,
        config=_config_whitelist(runtime.config if runtime is not None else {}),
    )


def _state_dict(state: Any) -> dict[str, Any]:
    if isinstance(state, dict):
        return dict(state)
    if isinstance(state, list):
        return {"messages": state}
    if hasattr(state, "model_dump"):
        return dict(state.model_dump())
    return dict(vars(state)) if hasattr(state, "__dict__") else {}


def _config_whitelist(config: Any) -> dict[str, Any]:
    """The run config a remote tool sees: thread and run ids, namespace, tags, metadata."""
    config = config or {}
    configurable = config.get("configurable") or {}
    out: dict[str, Any] = {
        key: str(configurable[key]) for key in ("thread_id", "checkpoint_ns") if key in configurable
    }
    if config.get("run_id") is not None:
        out["run_id"] = str(config["run_id"])
    for key in ("tags", "metadata"):
        value = config.get(key)
        if value:
            try:
                out[key] = to_wire(value, key)
            except ValueError:  # metadata holding objects is left out, not an error
                continue
    return out


def command_from(result_command: dict[str, Any], tool: str, call_id: str) -> Command[Any]:
    """The ``Command`` a remote tool returned, checked as ToolNode checks a local one.

    Raises:
        ValueError: its update carries no ToolMessage answering this call (ToolNode's rule).
    """
    update = from_wire(result_command.get("update"))
    goto = result_command.get("goto") or ()
    messages = update.get("messages") if isinstance(update, dict) else None
    if isinstance(messages, list) and not any(
        isinstance(m, ToolMessage) and m.tool_call_id == call_id for m in messages
    ):
        raise ValueError(
            f"Expected to have a matching ToolMessage in Command.update for tool '{tool}', "
            f"got: {messages}. Every tool call (LLM requesting to call a tool) in the "
            "message history MUST have a corresponding ToolMessage."
        )
    return Command(update=update, goto=goto)
