"""A ToolCallRequest as a call on the wire, and a result as a ToolMessage."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from orchestrator.dispatch import PreparedCall
from tool_workers.protocol import ToolResult, ToolSpec, call_key, task_id_for

log = logging.getLogger("toolfleet.orchestrator")


def prepare(request: ToolCallRequest, spec: ToolSpec) -> PreparedCall:
    """The wire form of the call in ``request``, with its deterministic task id."""
    config = request.runtime.config if request.runtime is not None else {}
    thread_id = (config.get("configurable") or {}).get("thread_id")
    run_id = _run_id(request, config)
    message = owning_message(request.state, request.tool_call["id"])
    return prepare_raw(
        request.tool_call, spec, thread_id, run_id, message.id if message is not None else None
    )


def prepare_raw(
    tool_call: Mapping[str, Any],
    spec: ToolSpec,
    thread_id: Any,
    run_id: str | None,
    message_id: str | None,
) -> PreparedCall:
    thread = str(thread_id) if thread_id is not None else None
    return PreparedCall(
        tool=tool_call["name"],
        call_id=tool_call["id"],
        args=dict(tool_call.get("args") or {}),
        task_id=task_id_for(call_key(thread, message_id, tool_call["id"])),
        thread_id=thread,
        run_id=run_id,
        queue=spec.queue,
        spec=spec,
    )


def _run_id(request: ToolCallRequest, config: Mapping[str, Any]) -> str | None:
    info = getattr(request.runtime, "execution_info", None)
    run_id = getattr(info, "run_id", None) or config.get("run_id")
    return str(run_id) if run_id is not None else None


def messages_of(state: Any) -> list[Any]:
    if isinstance(state, dict):
        return list(state.get("messages") or [])
    if isinstance(state, list):
        return state
    return list(getattr(state, "messages", None) or [])


_CALL_IDS: dict[int, tuple[AIMessage, frozenset[str]]] = {}
"""Call ids of recently seen AIMessages (by object id; the message is kept to pin the id)."""


def _call_ids(message: AIMessage) -> frozenset[str]:
    # Each Send task of an N-call fan-out looks up its call: index the message once.
    cached = _CALL_IDS.get(id(message))
    if cached is not None and cached[0] is message:
        return cached[1]
    ids = frozenset(call_id for tc in message.tool_calls if (call_id := tc.get("id")))
    if len(_CALL_IDS) > 256:
        _CALL_IDS.clear()
    _CALL_IDS[id(message)] = (message, ids)
    return ids


def owning_message(state: Any, call_id: str | None) -> AIMessage | None:
    """The AIMessage in ``state`` that made the call ``call_id`` (the latest one)."""
    for message in reversed(messages_of(state)):
        if isinstance(message, AIMessage) and message.tool_calls and call_id in _call_ids(message):
            return message
    return None


def answered_ids(state: Any) -> set[str]:
    return {m.tool_call_id for m in messages_of(state) if isinstance(m, ToolMessage)}


def to_message(call: PreparedCall, result: ToolResult) -> ToolMessage:
    """The ToolMessage for a call's result, as a local ToolNode would have built it."""
    return ToolMessage(
        content=result.content,
        artifact=result.artifact,
        status=result.status,
        name=call.tool,
        tool_call_id=call.call_id,
        response_metadata={
            "toolfleet": {
                "task_id": call.task_id,
                "worker": result.worker,
                "pid": result.pid,
                "duration": result.duration,
                "error_kind": result.error_kind,
            }
        },
    )


def answer_invalid_calls(state: Any) -> dict[str, Any] | None:
    """Error ToolMessages for the last AIMessage's ``invalid_tool_calls`` (state update).

    Jumps back to the model when the message made no valid call.
    """
    messages = messages_of(state)
    last = messages[-1] if messages else None
    if not isinstance(last, AIMessage) or not last.invalid_tool_calls:
        return None
    answered = answered_ids(state)
    errors = [
        ToolMessage(
            content=(
                f"Error: the arguments of your call to '{bad.get('name')}' are not "
                f"valid JSON ({bad.get('error') or 'unparseable'}): {bad.get('args')!r}\n"
                " Please fix your mistakes."
            ),
            name=bad.get("name") or "invalid_tool_call",
            tool_call_id=bad["id"],
            status="error",
            response_metadata={"toolfleet": {"error_kind": "invalid_args"}},
        )
        for bad in last.invalid_tool_calls
        if bad.get("id") and bad["id"] not in answered
    ]
    if not errors:
        return None
    log.warning("%d tool call(s) with malformed arguments answered with errors", len(errors))
    update: dict[str, Any] = {"messages": errors}
    if not last.tool_calls:
        update["jump_to"] = "model"
    return update
