"""A tool call ready to cross the wire (:class:`PreparedCall`), and how one is made.

A leaf module: it imports nothing of the transport, so the agent-facing modules and the
dispatchers can all use the value type without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from tool_workers.contract.models import Injected, ToolRequest, ToolSpec, TraceContext
from tool_workers.contract.names import call_key, task_id_for


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A tool call ready to cross the wire."""

    tool: str
    call_id: str
    args: dict[str, Any]
    task_id: str
    thread_id: str | None = None
    run_id: str | None = None
    queue: str | None = None
    spec: ToolSpec | None = field(default=None, compare=False)
    injected: Injected | None = field(default=None, compare=False)
    """Graph context the tool declared it needs."""
    attempt: int = 0
    """0 for the first dispatch; n for the n-th time an outer middleware retries the call."""
    trace: TraceContext | None = field(default=None, compare=False)
    """The caller's trace context, taken where the call was made (see orchestrator.tracing)."""

    def request(self) -> ToolRequest:
        """The wire request for this call."""
        return ToolRequest(
            tool=self.tool,
            call_id=self.call_id,
            args=self.args,
            idempotency_key=self.task_id,
            thread_id=self.thread_id,
            run_id=self.run_id,
            injected=self.injected,
            progress=True,
            trace=self.trace,
        )

    @property
    def idle_timeout(self) -> float | None:
        """Seconds a started call may show no life (its tool's ``idle_timeout`` policy)."""
        value = self.spec.options.get("idle_timeout") if self.spec is not None else None
        return float(value) if value else None


def prepare(request: ToolCallRequest, spec: ToolSpec) -> PreparedCall:
    """The wire form of the call in ``request``, with its deterministic task id."""
    config = request.runtime.config if request.runtime is not None else {}
    thread_id = (config.get("configurable") or {}).get("thread_id")
    run_id = _run_id(request, config)
    message = owning_message(request.state, request.tool_call["id"])
    return prepare_raw(request.tool_call, spec, thread_id, run_id, message_scope(request, message))


def message_scope(request: ToolCallRequest, message: AIMessage | None) -> str | None:
    """What tells the calls of ``message`` apart from every other AIMessage's calls.

    Within a thread that is the message's id. A graph without a thread id (no
    checkpointer), or whose messages carry no ids, would give ``call_0`` of every run the
    same identity, and a second run would be handed the first one's stored result: there
    the superstep's checkpoint id (unique per run and step; the same for every call of
    one fan-out, and when a checkpointed run resumes) or else the run id joins in.
    """
    message_id = message.id if message is not None else None
    config = request.runtime.config if request.runtime is not None else {}
    if (config.get("configurable") or {}).get("thread_id") is not None and message_id:
        return message_id
    info = getattr(request.runtime, "execution_info", None)
    salt = getattr(info, "checkpoint_id", None) or _run_id(request, config)
    if not salt:
        return message_id
    return f"{message_id or ''}@{salt}"


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
