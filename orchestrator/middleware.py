"""The tool-call hook: ``create_agent``'s ``wrap_tool_call`` sends calls to the workers.

The agent loop stays LangChain's. Each ``Send("tools", [call])`` reaches
:meth:`CeleryToolMiddleware.wrap_tool_call` (or ``awrap_tool_call``), which publishes the
call as a Celery task, waits for its result and returns the ToolMessage, built here
with the model's own ``tool_call_id``.

Parallelism:

* sync: LangGraph runs the Send tasks of a superstep in a pool of ``min(32, cpu + 4)``
  threads, so waiting per call would cap a fan-out at that many calls. The first call
  of an AIMessage to arrive therefore publishes every pending call of that AIMessage;
  each Send task then only waits for its own result (task ids are derived from the call,
  so the later arrivals attach to what was already published).
* async: every Send task is an asyncio task; calls that arrive in the same loop turn are
  published together in one batch, and each waits on the shared result listener.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, overload

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE, ToolCallRequest
from langgraph.types import Command

from orchestrator.calllog import log_finished
from orchestrator.calls import (
    answer_invalid_calls,
    answered_ids,
    owning_message,
    prepare,
    prepare_raw,
    to_message,
)
from orchestrator.deadline import _remaining, run_deadline
from orchestrator.dispatch import Dispatcher, PreparedCall
from orchestrator.eager import eager_is_safe, edited, hitl_edits
from orchestrator.events import ToolCallEvents
from orchestrator.fleet import dispatcher_for
from orchestrator.injection import command_from, injected_for
from orchestrator.placement import Placement, PlacementRules, configured_tools, describe
from orchestrator.registry_view import await_served, wait_served
from tool_workers.errors import ResultTimeout, RunDeadlineExceeded
from tool_workers.protocol import ToolResult, ToolSpec, task_id_for
from tool_workers.wire_json import NotJSONError

log = logging.getLogger("toolfleet.orchestrator")

_EAGER_MEMORY = 4096
"""AIMessages whose calls were already published, remembered to skip re-publishing."""


class CeleryToolMiddleware(AgentMiddleware):
    """Run the tool calls of a ``create_agent`` agent as Celery tasks on the workers.

    Calls of tools the workers serve go to the workers; tools added by other middleware
    (state tools, a todo list) and tools no worker serves run here through the normal
    handler (see :mod:`orchestrator.placement`).

    Example::

        agent = create_agent(model, tools, middleware=[CeleryToolMiddleware()])
    """

    def __init__(
        self,
        app: Any = None,
        *,
        dispatcher: Dispatcher | None = None,
        eager_dispatch: bool = True,
        unserved_wait: float | None = None,
        placement: Mapping[str, Placement] | None = None,
    ) -> None:
        """
        Args:
            app: The Celery app to publish with; built from ``TOOLFLEET_*`` settings if
                omitted.
            dispatcher: Use this dispatcher instead of one for ``app`` (tests, or a
                custom transport).
            eager_dispatch: In sync runs, publish every pending call of an AIMessage when
                the first one arrives (only done when the middleware wrapping tool calls
                outside this one cannot edit or gate calls; see :mod:`orchestrator.eager`).
            unserved_wait: Seconds a call waits for a worker serving its tool before it
                fails (default: ``TOOLFLEET_UNSERVED_WAIT``).
            placement: ``{"tool name": "local" | "remote"}``, overriding where calls run.
        """
        super().__init__()
        self._dispatcher = dispatcher if dispatcher is not None else dispatcher_for(app)
        self.eager_dispatch = eager_dispatch
        settings = getattr(self._dispatcher, "settings", None)
        default_wait = settings.unserved_wait if settings is not None else 10.0
        self.unserved_wait = default_wait if unserved_wait is None else unserved_wait
        self.rules = PlacementRules(placement, configured=configured_tools(settings))
        self._published: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._delivered: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._retry_of: dict[str, str] = {}
        self._placements_seen: set[frozenset[str]] = set()

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher calls go through."""
        return self._dispatcher

    # -- placement is visible: logged (and published) when an agent's tools are first seen

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Pass the model call on; note where the agent's tools run, once per tool set."""
        self._note_placement(request.tools)
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async flavour of :meth:`wrap_model_call`."""
        self._note_placement(request.tools)
        return await handler(request)

    def _note_placement(self, tools: Sequence[Any]) -> None:
        names = frozenset(getattr(t, "name", "") for t in tools if isinstance(t, BaseTool))
        if names in self._placements_seen:
            return
        self._placements_seen.add(names)
        table = self.rules.table(
            [t for t in tools if isinstance(t, BaseTool)], self._dispatcher.served_tools()
        )
        log.info(describe(table))
        note = getattr(self._dispatcher, "note_placement", None)
        if note is not None:
            note(table)

    # -- the tool hooks -------------------------------------------------------------------

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Run the call on the workers (publishing its pending siblings eagerly) or here."""
        route = self._route(request, self._dispatcher.served_tools(), waited=False)
        if route is None:
            name = request.tool_call["name"]
            served = wait_served(self._dispatcher, name, self.unserved_wait)
            route = self._route(request, served, waited=True)
        if route == "local":
            return handler(request)
        if isinstance(route, ToolMessage):
            return route
        call = route
        events = ToolCallEvents(request)
        if self.eager_dispatch and call.attempt == 0:
            self._publish_siblings(request, call, events)
        call = self._reconcile(call)
        deadline = run_deadline(request)
        events.track([call])
        if deadline is not None and deadline <= time.time():
            self._dispatcher.cancel([call])  # published eagerly by a sibling, maybe
            raise RunDeadlineExceeded(f"run deadline passed before {call.tool} could run")
        self._dispatcher.submit([call], events.on_state)
        events.dispatched(call)
        try:
            result = self._dispatcher.wait(call, _remaining(deadline))
        except ResultTimeout as exc:
            self._dispatcher.cancel([call], terminate=True)
            events.cancelled(call)
            raise RunDeadlineExceeded(f"run deadline passed while {call.tool} ran") from exc
        return self._finish(call, result, events)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Run the call on the workers (batched with this loop turn's calls) or here."""
        route = self._route(request, self._dispatcher.served_tools(), waited=False)
        if route is None:
            name = request.tool_call["name"]
            served = await await_served(self._dispatcher, name, self.unserved_wait)
            route = self._route(request, served, waited=True)
        if route == "local":
            return await handler(request)
        if isinstance(route, ToolMessage):
            return route
        call = route
        events = ToolCallEvents(request)
        events.track([call])
        deadline = run_deadline(request)
        if deadline is not None and deadline <= time.time():
            raise RunDeadlineExceeded(f"run deadline passed before {call.tool} could run")
        try:
            await _submit_async(self._dispatcher, call, events)
            events.dispatched(call)
            result = await self._dispatcher.wait_async(call, _remaining(deadline))
        except ResultTimeout as exc:
            self._dispatcher.cancel([call], terminate=True)
            events.cancelled(call)
            raise RunDeadlineExceeded(f"run deadline passed while {call.tool} ran") from exc
        except asyncio.CancelledError:
            # The run was cancelled (or a sibling failed): nothing keeps working for it.
            self._dispatcher.cancel([call], terminate=True)
            events.cancelled(call)
            raise
        return self._finish(call, result, events)

    @overload
    def _route(
        self, request: ToolCallRequest, served: Mapping[str, ToolSpec], *, waited: Literal[True]
    ) -> Literal["local"] | ToolMessage | PreparedCall: ...

    @overload
    def _route(
        self, request: ToolCallRequest, served: Mapping[str, ToolSpec], *, waited: bool
    ) -> Literal["local"] | ToolMessage | PreparedCall | None: ...

    def _route(
        self, request: ToolCallRequest, served: Mapping[str, ToolSpec], *, waited: bool
    ) -> Literal["local"] | ToolMessage | PreparedCall | None:
        """Where the call goes: here, an error answer, or the prepared remote call.

        ``None``: it belongs to the workers but none serves it yet; the caller waits
        (``unserved_wait``) and asks again with ``waited=True``.
        """
        name = request.tool_call["name"]
        placement, _ = self.rules.decide(name, request.tool, served)
        if placement == "local":
            return "local"
        spec = served.get(name)
        if spec is None:
            if not waited and request.tool is not None and self.unserved_wait > 0:
                return None
            return self._unserved(request, served)
        return self._prepare(request, spec)

    def _prepare(self, request: ToolCallRequest, spec: ToolSpec) -> PreparedCall | ToolMessage:
        """The call on the wire, with its graph context; an error message if that fails."""
        try:
            injected = injected_for(spec, request)
        except NotJSONError as exc:
            return _error(request, "context", f"Error: cannot send this call: {exc}.")
        call = prepare(request, spec)
        # Called again for a call it already answered: an outer middleware retries it.
        attempt = self._delivered.get(call.task_id, 0)
        if attempt:
            retry_id = task_id_for(f"{call.task_id}\x1fretry:{attempt}")
            self._retry_of[retry_id] = call.task_id
            call = replace(call, task_id=retry_id)
        return replace(call, injected=injected, attempt=attempt)

    def _finish(
        self, call: PreparedCall, result: ToolResult, events: ToolCallEvents
    ) -> ToolMessage | Command[Any]:
        events.finished(call, result)
        log_finished(call, result)
        key = self._retry_of.pop(call.task_id, call.task_id)
        self._delivered[key] = self._delivered.get(key, 0) + 1
        self._delivered.move_to_end(key)
        while len(self._delivered) > _EAGER_MEMORY:
            self._delivered.popitem(last=False)
        if result.command is not None:
            return command_from(result.command, call.tool, call.call_id)
        return to_message(call, result)

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """Answer tool calls whose arguments are not valid JSON with error ToolMessages.

        LangChain puts them in ``AIMessage.invalid_tool_calls``, which the agent loop
        never runs: without an answer the model would never learn of its mistake (and a
        message holding only such calls would end the run silently).
        """
        return answer_invalid_calls(state)

    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """Async flavour of :meth:`after_model`."""
        return self.after_model(state, runtime)

    # -- helpers --------------------------------------------------------------------------

    def _spec(self, request: ToolCallRequest) -> ToolSpec | None:
        return self._dispatcher.served_tools().get(request.tool_call["name"])

    def _unserved(self, request: ToolCallRequest, served: Mapping[str, ToolSpec]) -> ToolMessage:
        name = request.tool_call["name"]
        if request.tool is None:
            content = INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
                requested_tool=name, available_tools=", ".join(sorted(served))
            )
            kind = "unknown_tool"
        else:
            content = (
                f"Error: no worker serves the tool '{name}' right now (waited "
                f"{self.unserved_wait:g} s).\n Try again later or use another tool."
            )
            kind = "unserved"
        log.warning("call %s to %s not dispatched: %s", request.tool_call["id"], name, kind)
        return ToolMessage(
            content=content,
            name=name,
            tool_call_id=request.tool_call["id"],
            status="error",
            response_metadata={"toolfleet": {"error_kind": kind}},
        )

    def _publish_siblings(
        self, request: ToolCallRequest, call: PreparedCall, events: ToolCallEvents
    ) -> None:
        message = owning_message(request.state, call.call_id)
        if message is None:
            return
        marker = f"{call.thread_id}\x1f{message.id}"
        if marker in self._published:
            return
        self._published[marker] = None
        while len(self._published) > _EAGER_MEMORY:
            self._published.popitem(last=False)
        safe, apply_edits = eager_is_safe(self)
        if not safe:
            log.info("middleware outside toolfleet's may gate or edit calls: no eager fan-out")
            return
        edits = hitl_edits(request.state) if apply_edits else None
        served = self._dispatcher.served_tools()
        done = answered_ids(request.state)
        tools = {t.name: t for t in (getattr(request.runtime, "tools", None) or [])}
        siblings = []
        for original in message.tool_calls:
            if not original.get("id") or original["id"] in done:
                continue
            tool_call = edited(original, edits)
            spec = served.get(tool_call["name"])
            if spec is None or (
                self.rules.decide(tool_call["name"], tools.get(tool_call["name"]), served)[0]
                != "remote"
            ):
                continue
            try:
                injected = injected_for(spec, request)
            except NotJSONError:
                continue  # its own Send task reports the error
            sibling = prepare_raw(tool_call, spec, call.thread_id, call.run_id, message.id)
            siblings.append(replace(sibling, injected=injected))
        events.track(siblings)
        self._dispatcher.submit(siblings, events.on_state)

    def _reconcile(self, call: PreparedCall) -> PreparedCall:
        """A call that reached us edited (by an outer middleware) is not the one published."""
        submitted = getattr(self._dispatcher, "submitted", None)
        published = submitted(call.task_id) if submitted is not None else None
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
        return PreparedCall(
            tool=call.tool,
            call_id=call.call_id,
            args=call.args,
            task_id=task_id_for(f"{call.task_id}\x1fedit:{digest}"),
            thread_id=call.thread_id,
            run_id=call.run_id,
            queue=call.queue,
            spec=call.spec,
        )


def _error(request: ToolCallRequest, kind: str, content: str) -> ToolMessage:
    return ToolMessage(
        content=content,
        name=request.tool_call["name"],
        tool_call_id=request.tool_call["id"],
        status="error",
        response_metadata={"toolfleet": {"error_kind": kind}},
    )


async def _submit_async(dispatcher: Dispatcher, call: PreparedCall, events: ToolCallEvents) -> None:
    submit_async = getattr(dispatcher, "submit_async", None)
    if submit_async is not None:
        await submit_async(call, events.on_state)
    else:
        dispatcher.submit([call], events.on_state)
