"""Eager fan-out for sync runs, and when it is safe.

LangGraph runs the Send tasks of a sync superstep in ``min(32, cpu + 4)`` threads, so the
first call of an AIMessage to reach the middleware publishes every pending call of that
AIMessage. That is only right when each sibling would reach the middleware unchanged: a
middleware wrapping tool calls *outside* this one may edit a call, gate it behind an
interrupt, or answer it itself. Eager publication therefore happens only when every
outer tool-call wrapper is known not to do that, with one adaptation: the reviewer's
edits of LangChain's human-in-the-loop middleware (batched mode) are applied first.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from orchestrator.calls import (
    PreparedCall,
    answered_ids,
    message_scope,
    owning_message,
    prepare_raw,
)
from orchestrator.dispatch.base import Dispatcher
from orchestrator.events import ToolCallEvents
from orchestrator.injection import injected_for
from orchestrator.placement import PlacementRules
from tool_workers.contract.models import ToolSpec
from tool_workers.contract.names import task_id_for
from tool_workers.contract.wire_json import NotJSONError

SAFE_OUTER = frozenset({"ToolRetryMiddleware", "ToolErrorMiddleware"})
"""Outer wrappers that pass each call on unchanged (retries get attempts of their own)."""

_STOP_FRAMES = frozenset({"_run_one", "_arun_one", "_func", "_afunc"})


def outer_wrappers(me: AgentMiddleware[Any, Any]) -> list[AgentMiddleware[Any, Any]]:
    """The middleware whose ``wrap_tool_call`` encloses ``me``'s current call."""
    found: list[AgentMiddleware[Any, Any]] = []
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name not in _STOP_FRAMES:
        owner = frame.f_locals.get("self")
        if (
            frame.f_code.co_name in ("wrap_tool_call", "awrap_tool_call")
            and isinstance(owner, AgentMiddleware)
            and owner is not me
        ):
            found.append(owner)
        frame = frame.f_back  # type: ignore[assignment]
    return found


def hitl_edits(state: Any) -> Mapping[str, Any] | None:
    """The reviewer's edits (by call id) LangChain's HITL middleware keeps in the state."""
    try:
        from langchain.agents.middleware.human_in_the_loop import _EDITED_TOOL_CALLS_KEY
    except ImportError:  # another langchain: no known key, so no edits to apply
        return None
    edits = state.get(_EDITED_TOOL_CALLS_KEY) if isinstance(state, dict) else None
    return edits or None


def eager_is_safe(me: AgentMiddleware[Any, Any]) -> tuple[bool, bool]:
    """Whether siblings may be published eagerly, and whether HITL edits must be applied."""
    apply_edits = False
    for outer in outer_wrappers(me):
        name = type(outer).__name__
        if name in SAFE_OUTER:
            continue
        if name == "HumanInTheLoopMiddleware" and getattr(outer, "interrupt_mode", "") == "batched":
            apply_edits = True  # decided before the tools node; edits are in the state
            continue
        return False, False
    return True, apply_edits


def edited(tool_call: Mapping[str, Any], edits: Mapping[str, Any] | None) -> dict[str, Any]:
    """``tool_call`` as the reviewer edited it (HITL), or unchanged."""
    call_id = tool_call.get("id")
    action = edits.get(call_id) if edits and call_id is not None else None
    if not action:
        return dict(tool_call)
    return {**tool_call, "name": action["name"], "args": action["args"]}


def pending_siblings(
    request: ToolCallRequest,
    message: AIMessage,
    call: PreparedCall,
    served: Mapping[str, ToolSpec],
    remote: Callable[[str], bool],
    edits: Mapping[str, Any] | None,
) -> list[PreparedCall]:
    """Every unanswered call of ``message`` bound for the workers, ready to publish.

    Args:
        request: The request of the call that arrived first (its state and run).
        message: The AIMessage that made the calls.
        call: That first call, prepared (its thread and run ids are the siblings').
        served: The tools the workers serve now.
        remote: Whether calls of a tool (by name) run on the workers.
        edits: The reviewer's edits to apply first (HITL), by call id.
    """
    done = answered_ids(request.state)
    scope = message_scope(request, message)
    siblings = []
    for original in message.tool_calls:
        if not original.get("id") or original["id"] in done:
            continue
        tool_call = edited(original, edits)
        spec = served.get(tool_call["name"])
        if spec is None or not remote(tool_call["name"]):
            continue
        try:
            injected = injected_for(spec, request)
        except NotJSONError:
            continue  # its own Send task reports the error
        sibling = prepare_raw(tool_call, spec, call.thread_id, call.run_id, scope)
        siblings.append(replace(sibling, injected=injected))
    return siblings


log = logging.getLogger("toolfleet.orchestrator")

EAGER_MEMORY = 4096
"""AIMessages whose calls were already published, remembered to skip re-publishing (and
calls answered, remembered to tell an outer middleware's retry)."""


class EagerFanOut:
    """The sync fan-out of one middleware: the first call of an AIMessage publishes its
    siblings; a call that arrives edited after that goes out under a task id of its own."""

    def __init__(
        self, me: AgentMiddleware[Any, Any], dispatcher: Dispatcher, rules: PlacementRules
    ) -> None:
        self._me = me
        self._dispatcher = dispatcher
        self._rules = rules
        self._published: collections.OrderedDict[str, None] = collections.OrderedDict()

    def publish_siblings(
        self, request: ToolCallRequest, call: PreparedCall, events: ToolCallEvents
    ) -> None:
        """Publish every pending call of ``call``'s AIMessage, once per AIMessage."""
        message = owning_message(request.state, call.call_id)
        if message is None:
            return
        marker = f"{call.thread_id}\x1f{message_scope(request, message)}"
        if marker in self._published:
            return
        self._published[marker] = None
        while len(self._published) > EAGER_MEMORY:
            self._published.popitem(last=False)
        safe, apply_edits = eager_is_safe(self._me)
        if not safe:
            log.info("middleware outside toolfleet's may gate or edit calls: no eager fan-out")
            return
        served = self._dispatcher.served_tools()
        tools = {t.name: t for t in (getattr(request.runtime, "tools", None) or [])}

        def remote(name: str) -> bool:
            return self._rules.decide(name, tools.get(name), served)[0] == "remote"

        edits = hitl_edits(request.state) if apply_edits else None
        siblings = pending_siblings(request, message, call, served, remote, edits)
        events.track(siblings)
        self._dispatcher.submit(siblings, events.on_state)

    def reconcile(self, call: PreparedCall) -> PreparedCall:
        """A call that reached the middleware edited (by an outer middleware) is not the
        one published: revoke that one; the edited call goes out under a task id of its
        own, with the same graph context and attempt."""
        published = self._dispatcher.submitted(call.task_id)
        if published is None or published.args == call.args:
            return call
        log.warning(
            "call %s to %s was edited after it was published eagerly; revoking the published "
            "one (pass eager_dispatch=False when a middleware edits calls)",
            call.call_id,
            call.tool,
        )
        self._dispatcher.cancel([published])
        digest = hashlib.sha256(json.dumps(call.args, sort_keys=True).encode()).hexdigest()[:16]
        return replace(call, task_id=task_id_for(f"{call.task_id}\x1fedit:{digest}"))
