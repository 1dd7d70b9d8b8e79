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
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from orchestrator.callbacks import aend_tool_run, astart_tool_run, end_tool_run, start_tool_run
from orchestrator.calllog import log_finished
from orchestrator.calls import PreparedCall, prepare
from orchestrator.deadline import remaining, run_deadline
from orchestrator.dispatch.base import Dispatcher
from orchestrator.dispatch.fleet import dispatcher_for
from orchestrator.eager import EAGER_MEMORY, EagerFanOut
from orchestrator.events import ToolCallEvents
from orchestrator.injection import command_from, injected_for
from orchestrator.messages import (
    answer_invalid_calls,
    error_message,
    not_sendable_text,
    result_message,
    unknown_tool_text,
    unserved_text,
)
from orchestrator.offering import ToolOffer
from orchestrator.placement import Placement, PlacementRules, describe
from orchestrator.tracing import dispatch_span, trace_context
from tool_workers.contract.errors import ResultTimeout, RunDeadlineExceeded
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import task_id_for
from tool_workers.contract.wire_json import NotJSONError

log = logging.getLogger("toolfleet.orchestrator")

_POLL = 0.25
"""Seconds between registry reads while a call waits for a worker serving its tool."""


class _Wait:
    """Route of a call whose tool no worker serves yet: it waits for one to appear."""


WAIT = _Wait()

Decided = Literal["local"] | ToolMessage | PreparedCall
"""Where a call goes: here, answered in its place, or to the workers."""

Route = Decided | _Wait


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
        discover: bool = False,
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
            discover: Offer the model every tool the live workers serve, added to each
                model request (instead of ``discover_tools()`` in ``tools=``); a served
                tool whose name the agent already has (another middleware's, such as
                Deep Agents' ``read_file``) yields to it, with a warning. See
                :mod:`orchestrator.offering`.
        """
        super().__init__()
        self._dispatcher = dispatcher if dispatcher is not None else dispatcher_for(app)
        self.eager_dispatch = eager_dispatch
        settings = self._dispatcher.settings
        self.unserved_wait = settings.unserved_wait if unserved_wait is None else unserved_wait
        self.rules = PlacementRules(placement, configured=self._dispatcher.policies.tools)
        self._delivered: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._retry_of: dict[str, str] = {}
        self._placements_seen: set[frozenset[str]] = set()
        self._offer = ToolOffer(self._dispatcher) if discover else None
        self._eager = EagerFanOut(self, self._dispatcher, self.rules)

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher calls go through."""
        return self._dispatcher

    # -- placement is visible: logged (and published) when an agent's tools are first seen

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Pass the model call on (with the fleet's tools added when ``discover`` is set);
        note where the agent's tools run, once per tool set."""
        served = self._dispatcher.served_tools()
        request = self._offered(request, served)
        tools = self._new_tool_set(request.tools)
        if tools is not None:
            self._dispatcher.note_placement(self._placement(tools, served))
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async flavour of :meth:`wrap_model_call`."""
        served = await self._dispatcher.served_tools_async()
        request = self._offered(request, served)
        tools = self._new_tool_set(request.tools)
        if tools is not None:
            await self._dispatcher.note_placement_async(self._placement(tools, served))
        return await handler(request)

    def _offered(self, request: Any, served: Mapping[str, ToolSpec]) -> Any:
        """The request with the fleet's tools added (``discover``), the clashes noted."""
        if self._offer is None:
            return request
        tools, yielded = self._offer.extend(request.tools, served)
        self.rules.yield_to(yielded)
        return request.override(tools=tools) if len(tools) != len(request.tools) else request

    def _new_tool_set(self, tools: Sequence[Any]) -> list[BaseTool] | None:
        """The agent's tools, the first time this set of tools is seen; else ``None``."""
        agent_tools = [t for t in tools if isinstance(t, BaseTool)]
        names = frozenset(t.name for t in agent_tools)
        if names in self._placements_seen:
            return None
        self._placements_seen.add(names)
        return agent_tools

    def _placement(
        self, tools: list[BaseTool], served: Mapping[str, ToolSpec]
    ) -> dict[str, dict[str, str]]:
        """Where each of the agent's tools runs (logged; the caller publishes it)."""
        table = self.rules.table(tools, served)
        log.info(describe(table))
        return table

    # -- the tool hooks: the same decisions, sync and async; they differ in how they wait

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Run the call on the workers (publishing its pending siblings eagerly) or here."""
        route = self._route(request, self._dispatcher.served_tools())
        if isinstance(route, _Wait):
            for delay in self._waiting_for_worker(request):
                time.sleep(delay)
                route = self._route(request, self._dispatcher.served_tools())
                if not isinstance(route, _Wait):
                    break
        route = self._after_waiting(request, route)
        if route == "local":
            return handler(request)
        if isinstance(route, ToolMessage):
            return route
        run = start_tool_run(request, route)
        with dispatch_span(route) as span:
            route = replace(route, trace=trace_context(run.run_id, run.handlers))
            try:
                output = self._run_remote(request, route)
            except BaseException as exc:
                run.on_tool_error(exc, tool_call_id=route.call_id)
                raise
            span.finished(output)
        end_tool_run(run, route, output)
        return output

    def _run_remote(
        self, request: ToolCallRequest, call: PreparedCall
    ) -> ToolMessage | Command[Any]:
        events = ToolCallEvents(request)
        # A traced call's siblings are not published ahead: each carries the trace
        # context of its own tool run and span, which exist once its Send task runs.
        if self.eager_dispatch and call.attempt == 0 and call.trace is None:
            self._eager.publish_siblings(request, call, events)
            call = self._eager.reconcile(call)
        events.track([call])
        deadline = run_deadline(request)
        if _passed(deadline):
            self._dispatcher.cancel([call])  # published eagerly by a sibling, maybe
            raise _deadline_error(call, before=True)
        self._dispatcher.submit([call], events.on_state)
        events.dispatched(call)
        try:
            result = self._dispatcher.wait(call, remaining(deadline))
        except ResultTimeout as exc:
            self._dispatcher.cancel([call], terminate=True)
            events.cancelled(call)
            raise _deadline_error(call, before=False) from exc
        return self._finish(call, result, events)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Run the call on the workers (batched with this loop turn's calls) or here."""
        route = self._route(request, await self._dispatcher.served_tools_async())
        if isinstance(route, _Wait):
            for delay in self._waiting_for_worker(request):
                await asyncio.sleep(delay)
                route = self._route(request, await self._dispatcher.served_tools_async())
                if not isinstance(route, _Wait):
                    break
        route = self._after_waiting(request, route)
        if route == "local":
            return await handler(request)
        if isinstance(route, ToolMessage):
            return route
        run = await astart_tool_run(request, route)
        with dispatch_span(route) as span:
            # Taken here, in the call's coroutine: the publishing thread has no context.
            route = replace(route, trace=trace_context(run.run_id, run.handlers))
            try:
                output = await self._arun_remote(request, route)
            except BaseException as exc:
                await run.on_tool_error(exc, tool_call_id=route.call_id)
                raise
            span.finished(output)
        await aend_tool_run(run, route, output)
        return output

    async def _arun_remote(
        self, request: ToolCallRequest, call: PreparedCall
    ) -> ToolMessage | Command[Any]:
        events = ToolCallEvents(request)
        events.track([call])
        deadline = run_deadline(request)
        if _passed(deadline):
            raise _deadline_error(call, before=True)
        try:
            await self._dispatcher.submit_async(call, events.on_state)
            events.dispatched(call)
            result = await self._dispatcher.wait_async(call, remaining(deadline))
        except ResultTimeout as exc:
            await self._dispatcher.cancel_async([call], terminate=True)
            events.cancelled(call)
            raise _deadline_error(call, before=False) from exc
        except asyncio.CancelledError:
            # The run was cancelled (or a sibling failed): nothing keeps working for it.
            events.cancelled(call)
            await self._dispatcher.cancel_async([call], terminate=True)
            raise
        return self._finish(call, result, events)

    def _route(self, request: ToolCallRequest, served: Mapping[str, ToolSpec]) -> Route:
        """Where the call goes, given the tools served now.

        :data:`WAIT`: it belongs to the workers, none serves it yet, and it may wait
        (``unserved_wait``, bounded by the run's deadline) for one to appear.
        """
        name = request.tool_call["name"]
        placement, _ = self.rules.decide(name, request.tool, served)
        if placement == "local":
            return "local"
        spec = served.get(name)
        if spec is None:
            if request.tool is None:  # not a tool of this agent: no worker will bring it
                log.warning("call %s to unknown tool %s", request.tool_call["id"], name)
                return error_message(
                    name, request.tool_call["id"], "unknown_tool", unknown_tool_text(name, served)
                )
            return WAIT
        return self._prepare(request, spec)

    def _waiting_for_worker(self, request: ToolCallRequest) -> Iterator[float]:
        """The sleeps of a call waiting for a worker: ``unserved_wait`` at most, never
        past the run's deadline."""
        budget = self.unserved_wait
        deadline = run_deadline(request)
        if deadline is not None:
            budget = min(budget, max(deadline - time.time(), 0.0))
        until = time.monotonic() + budget
        while (left := until - time.monotonic()) > 0:
            yield min(_POLL, left)

    def _after_waiting(self, request: ToolCallRequest, route: Route) -> Decided:
        """A call still unserved after its wait: the run's deadline, or an error answer.

        Raises:
            RunDeadlineExceeded: the run's deadline passed while the call waited.
        """
        if not isinstance(route, _Wait):
            return route
        name = request.tool_call["name"]
        if _passed(run_deadline(request)):
            raise RunDeadlineExceeded(f"run deadline passed before a worker served {name}")
        log.warning("call %s to %s not dispatched: unserved", request.tool_call["id"], name)
        return error_message(
            name, request.tool_call["id"], "unserved", unserved_text(name, self.unserved_wait)
        )

    def _prepare(self, request: ToolCallRequest, spec: ToolSpec) -> PreparedCall | ToolMessage:
        """The call on the wire, with its graph context; an error message if that fails."""
        try:
            injected = injected_for(spec, request)
        except NotJSONError as exc:
            return error_message(
                request.tool_call["name"],
                request.tool_call["id"],
                "context",
                not_sendable_text(exc),
            )
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
        while len(self._delivered) > EAGER_MEMORY:
            self._delivered.popitem(last=False)
        if result.command is not None:
            return command_from(result.command, call.tool, call.call_id)
        return result_message(call, result)

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


def _passed(deadline: float | None) -> bool:
    return deadline is not None and deadline <= time.time()


def _deadline_error(call: PreparedCall, *, before: bool) -> RunDeadlineExceeded:
    when = "before" if before else "while"
    verb = "could run" if before else "ran"
    return RunDeadlineExceeded(f"run deadline passed {when} {call.tool} {verb}")
