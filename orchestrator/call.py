"""A tool call, unpacked once at the edge: :class:`CallSite` and :class:`PreparedCall`.

LangGraph hands the tool hook a ``ToolCallRequest``: the call, the graph state, the run's
config and runtime. :meth:`CallSite.of` reads everything toolfleet needs from it once
(the thread and run ids, the scope that tells this AIMessage's calls apart, the run's
deadline as a monotonic time, the callback config, the stream writer, the graph context
a tool may ask for); nothing downstream reads the request again. :func:`prepare` turns a
site and the tool's spec into the :class:`PreparedCall` that crosses the wire.

A leaf module: it imports nothing of the transport, so the agent-facing modules and the
dispatchers all use these value types without importing each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool

from orchestrator.deadline import DEADLINE_KEY
from tool_workers.contract.models import Injected, ToolRequest, ToolSpec, TraceContext
from tool_workers.contract.names import call_key, task_id_for
from tool_workers.contract.settings import ToolPolicies
from tool_workers.contract.wire_json import to_wire

HANDED_ON: set[str] = set()
"""Ids of the runs this process stops because another process takes them over (a
replica of ``toolfleet serve`` that drains, or lost its run's lease). Their calls' hooks,
cancelled, leave the calls running on the workers: the run's next attempt attaches to
them."""


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where a call was made: what the run gives it, read once from LangGraph's request."""

    name: str
    """The tool the model called."""
    call_id: str
    """The model's ``tool_call_id``."""
    args: dict[str, Any]
    tool: BaseTool | None = None
    """The agent's tool object of that name, if the agent has one."""
    thread_id: str | None = None
    run_id: str | None = None
    scope: str | None = None
    """What tells this AIMessage's calls apart from every other AIMessage's calls."""
    fan_out: int = 1
    """How many calls the AIMessage made (this one among them)."""
    deadline: float | None = None
    """The run's deadline, ``time.monotonic()`` based (``None``: none)."""
    expires_at: float | None = None
    """The same deadline as Unix time: the ``expires`` the workers honour."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The run's config: callbacks, tags, metadata, run name (for the tool callbacks)."""
    writer: Callable[[Any], None] | None = None
    """The run's stream writer (``custom`` events), if it has one."""
    state: Any = None
    """The graph state (read only when the tool asks for injected arguments)."""
    context: Any = None
    """The run's ``context``."""

    @property
    def handed_on(self) -> bool:
        """Whether the run is being handed on (:data:`HANDED_ON`): a cancellation of the
        call's hook then leaves the call running."""
        return self.run_id is not None and self.run_id in HANDED_ON

    @classmethod
    def of(cls, request: Any) -> CallSite:
        """The site of the call in LangGraph's ``ToolCallRequest``."""
        call = request.tool_call
        runtime = request.runtime
        config: Mapping[str, Any] = (runtime.config if runtime is not None else None) or {}
        configurable = config.get("configurable") or {}
        thread = configurable.get("thread_id")
        thread_id = str(thread) if thread is not None else None
        info = getattr(runtime, "execution_info", None)
        run = getattr(info, "run_id", None) or config.get("run_id")
        run_id = str(run) if run is not None else None
        message = owning_message(request.state, call.get("id"))
        deadline, expires_at = deadline_of(configurable)
        return cls(
            name=call["name"],
            call_id=call.get("id") or "",
            args=dict(call.get("args") or {}),
            tool=request.tool,
            thread_id=thread_id,
            run_id=run_id,
            scope=_scope(thread_id, message, getattr(info, "checkpoint_id", None), run_id),
            fan_out=len(message.tool_calls) if message is not None else 1,
            deadline=deadline,
            expires_at=expires_at,
            config=config,
            writer=getattr(runtime, "stream_writer", None) if runtime is not None else None,
            state=request.state,
            context=getattr(runtime, "context", None) if runtime is not None else None,
        )

    @property
    def fan_out_key(self) -> str | None:
        """What names this call's fan-out (its AIMessage's calls) in this process."""
        return None if self.scope is None else f"{self.thread_id}\x1f{self.scope}"

    def remaining(self) -> float | None:
        """Seconds left until the run's deadline (never negative); ``None`` without one."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def passed(self) -> bool:
        """Whether the run's deadline has passed."""
        return self.deadline is not None and self.deadline <= time.monotonic()


def deadline_of(configurable: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A run's deadline from its ``configurable`` (:func:`~orchestrator.with_deadline`):
    ``(monotonic, Unix time)``, or ``(None, None)``."""
    value = configurable.get(DEADLINE_KEY)
    if value is None:
        return None, None
    at = float(value)
    return time.monotonic() + (at - time.time()), at


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
    deadline: float | None = field(default=None, compare=False)
    """The run's deadline (``time.monotonic()``): the wait for the result ends there."""
    expires_at: float | None = field(default=None, compare=False)
    """The run's deadline as Unix time: a worker that gets the call later does not run it."""

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

    def idempotent(self, policies: ToolPolicies) -> bool:
        """Whether the call's tool may run twice: as its worker's spec says, else as the
        orchestrator's ``policies`` say."""
        stated = self.spec.options.get("idempotent") if self.spec is not None else None
        if isinstance(stated, bool):
            return stated
        return policies.for_tool(self.tool).idempotent

    @property
    def idle_timeout(self) -> float | None:
        """Seconds a started call may show no life (its tool's ``idle_timeout`` policy)."""
        value = self.spec.options.get("idle_timeout") if self.spec is not None else None
        return float(value) if value else None


def prepare(site: CallSite, spec: ToolSpec) -> PreparedCall:
    """The wire form of the call at ``site``, with its deterministic task id.

    Raises:
        NotJSONError: a value the tool needs injected cannot be JSON (named).
    """
    return PreparedCall(
        tool=site.name,
        call_id=site.call_id,
        args=site.args,
        task_id=task_id_for(call_key(site.thread_id, site.scope, site.call_id)),
        thread_id=site.thread_id,
        run_id=site.run_id,
        queue=spec.queue,
        spec=spec,
        injected=injected_for(spec, site),
        deadline=site.deadline,
        expires_at=site.expires_at,
    )


def injected_for(spec: ToolSpec, site: CallSite) -> Injected | None:
    """What the call must carry for the tool's injected arguments (``None``: nothing).

    The state fields named by its ``InjectedState`` arguments (never the message history
    unless the orchestrator's policy sets ``inject_messages`` for the tool: it grows with
    every turn, and a worker's registry entry must not be able to ask for it), the run's
    ``context``, and a whitelist of the run's config.

    Raises:
        NotJSONError: a value the tool needs cannot be JSON (the message names it).
    """
    wanted = spec.injected
    if not wanted.any:
        return None
    state = _state_dict(site.state)
    fields: dict[str, Any] = {}
    # The orchestrator's policy alone decides this (the registry view puts it in the spec
    # it routes with); what a worker declares cannot ask for the history.
    with_history = bool(spec.options.get("inject_messages"))
    if wanted.runtime or any(f is None for f in wanted.state.values()):
        fields.update({k: v for k, v in state.items() if k != "messages" or with_history})
    for name in wanted.state.values():
        if name is not None and name in state and (name != "messages" or with_history):
            fields[name] = state[name]
    return Injected(
        state=to_wire(fields, "state"),
        context=to_wire(site.context, "context") if wanted.runtime else None,
        config=_config_whitelist(site.config),
    )


def _state_dict(state: Any) -> dict[str, Any]:
    if isinstance(state, dict):
        return dict(state)
    if isinstance(state, list):
        return {"messages": state}
    if hasattr(state, "model_dump"):
        return dict(state.model_dump())
    return dict(vars(state)) if hasattr(state, "__dict__") else {}


def _config_whitelist(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config a remote tool sees: thread and run ids, namespace, tags, metadata."""
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


def _scope(
    thread_id: str | None, message: AIMessage | None, checkpoint_id: Any, run_id: str | None
) -> str | None:
    """What tells the calls of ``message`` apart from every other AIMessage's calls.

    Within a thread that is the message's id. A graph without a thread id (no
    checkpointer), or whose messages carry no ids, would give ``call_0`` of every run the
    same identity, and a second run would be handed the first one's stored result: there
    the superstep's checkpoint id (unique per run and step; the same for every call of
    one fan-out, and when a checkpointed run resumes) or else the run id joins in.
    """
    message_id = message.id if message is not None else None
    if thread_id is not None and message_id:
        return message_id
    salt = checkpoint_id or run_id
    if not salt:
        return message_id
    return f"{message_id or ''}@{salt}"


def messages_of(state: Any) -> list[Any]:
    """The message list of a graph state (a dict, a list of messages, or an object)."""
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
    messages = state.get("messages") if isinstance(state, dict) else None
    for message in reversed(messages if isinstance(messages, list) else messages_of(state)):
        if isinstance(message, AIMessage) and message.tool_calls and call_id in _call_ids(message):
            return message
    return None


def answered_ids(state: Any) -> set[str]:
    """The ids of the calls that have a ToolMessage in ``state``."""
    return {m.tool_call_id for m in messages_of(state) if isinstance(m, ToolMessage)}
