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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE, ToolCallRequest
from langgraph.types import Command

from orchestrator.calllog import log_finished
from orchestrator.calls import (
    answered_ids,
    messages_of,
    owning_message,
    prepare,
    prepare_raw,
    to_message,
)
from orchestrator.dispatch import Dispatcher, PreparedCall
from orchestrator.events import ToolCallEvents
from orchestrator.fleet import dispatcher_for
from tool_workers.errors import ResultTimeout, RunDeadlineExceeded
from tool_workers.protocol import ToolSpec, task_id_for

log = logging.getLogger("toolfleet.orchestrator")

_EAGER_MEMORY = 4096
"""AIMessages whose calls were already published, remembered to skip re-publishing."""


class CeleryToolMiddleware(AgentMiddleware):  # type: ignore[type-arg]
    """Run every tool call of a ``create_agent`` agent as a Celery task on the workers.

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
    ) -> None:
        """
        Args:
            app: The Celery app to publish with; built from ``TOOLFLEET_*`` settings if
                omitted.
            dispatcher: Use this dispatcher instead of one for ``app`` (tests, or a
                custom transport).
            eager_dispatch: In sync runs, publish every pending call of an AIMessage when
                the first one arrives. Turn off when a middleware listed before this one
                edits, gates or short-circuits calls inside its own ``wrap_tool_call``.
            unserved_wait: Seconds a call waits for a worker serving its tool before it
                fails (default: ``TOOLFLEET_UNSERVED_WAIT``).
        """
        super().__init__()
        self._dispatcher = dispatcher if dispatcher is not None else dispatcher_for(app)
        self.eager_dispatch = eager_dispatch
        settings = getattr(self._dispatcher, "settings", None)
        default_wait = settings.unserved_wait if settings is not None else 10.0
        self.unserved_wait = default_wait if unserved_wait is None else unserved_wait
        self._published: collections.OrderedDict[str, None] = collections.OrderedDict()

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher calls go through."""
        return self._dispatcher

    # -- the hooks ----------------------------------------------------------------------

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Publish the call (and, eagerly, its pending siblings) and wait for its result."""
        spec = self._spec(request)
        if spec is None:
            served = self._dispatcher.served_tools()
            if request.tool is not None and self.unserved_wait > 0:
                served = _wait_served(
                    self._dispatcher, request.tool_call["name"], self.unserved_wait
                )
            spec = served.get(request.tool_call["name"])
            if spec is None:
                return self._unserved(request, served)
        call = prepare(request, spec)
        events = ToolCallEvents(request)
        if self.eager_dispatch:
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
        events.finished(call, result)
        log_finished(call, result)
        return to_message(call, result)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Publish the call with the others of this loop turn and await its result."""
        spec = self._spec(request)
        if spec is None:
            served = self._dispatcher.served_tools()
            if request.tool is not None and self.unserved_wait > 0:
                served = await _await_served(
                    self._dispatcher, request.tool_call["name"], self.unserved_wait
                )
            spec = served.get(request.tool_call["name"])
            if spec is None:
                return self._unserved(request, served)
        call = prepare(request, spec)
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
        events.finished(call, result)
        log_finished(call, result)
        return to_message(call, result)

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """Answer tool calls whose arguments are not valid JSON with error ToolMessages.

        LangChain puts them in ``AIMessage.invalid_tool_calls``, which the agent loop
        never runs: without an answer the model would never learn of its mistake (and a
        message holding only such calls would end the run silently).
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
        served = self._dispatcher.served_tools()
        done = answered_ids(request.state)
        siblings = [
            prepare_raw(tc, served[tc["name"]], call.thread_id, call.run_id, message.id)
            for tc in message.tool_calls
            if tc.get("id") and tc["id"] not in done and tc["name"] in served
        ]
        events.track(siblings)
        self._dispatcher.submit(siblings, events.on_state)
        self._published[marker] = None
        while len(self._published) > _EAGER_MEMORY:
            self._published.popitem(last=False)

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


DEADLINE_KEY = "toolfleet_deadline"
"""``config["configurable"]`` key holding a run's deadline (Unix time)."""


def with_deadline(seconds: float, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run config whose tool calls must finish within ``seconds`` from now.

    When the deadline passes, the run's in-flight calls are revoked (terminated on prefork
    workers), calls not yet sent are never sent, and the run raises
    :class:`~tool_workers.errors.RunDeadlineExceeded`.

    Example::

        agent.invoke(inputs, with_deadline(30, {"configurable": {"thread_id": "t1"}}))
    """
    config = dict(config or {})
    config["configurable"] = {
        **(config.get("configurable") or {}),
        DEADLINE_KEY: time.time() + seconds,
    }
    return config


def run_deadline(request: ToolCallRequest) -> float | None:
    """The deadline (Unix time) of the run ``request`` belongs to, if it has one."""
    config = request.runtime.config if request.runtime is not None else {}
    value = (config.get("configurable") or {}).get(DEADLINE_KEY)
    return float(value) if value is not None else None


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.time(), 0.0)


def _wait_served(dispatcher: Dispatcher, name: str, timeout: float) -> Mapping[str, ToolSpec]:
    deadline = time.monotonic() + timeout
    while True:
        served = dispatcher.served_tools()
        if name in served or time.monotonic() >= deadline:
            return served
        time.sleep(0.25)


async def _await_served(
    dispatcher: Dispatcher, name: str, timeout: float
) -> Mapping[str, ToolSpec]:
    deadline = time.monotonic() + timeout
    while True:
        served = dispatcher.served_tools()
        if name in served or time.monotonic() >= deadline:
            return served
        await asyncio.sleep(0.25)


async def _submit_async(dispatcher: Dispatcher, call: PreparedCall, events: ToolCallEvents) -> None:
    submit_async = getattr(dispatcher, "submit_async", None)
    if submit_async is not None:
        await submit_async(call, events.on_state)
    else:
        dispatcher.submit([call], events.on_state)
