"""The tool-call hook: ``create_agent``'s ``wrap_tool_call`` sends calls to the workers.

The agent loop stays LangChain's. Each ``Send("tools", [call])`` reaches
:meth:`CeleryToolMiddleware.wrap_tool_call` (or ``awrap_tool_call``), which decides
where the call runs, publishes it as a Celery task, waits for its result and returns
the ToolMessage, built here with the model's own ``tool_call_id``. Both hooks run one
flow (:meth:`CeleryToolMiddleware._call`) whose every step that waits names its blocking
and its awaited side; a sync hook runs it to its end with no event loop.

Parallelism: every Send task of a superstep calls the hook on its own. Async runs make
each an asyncio task, and the calls of one loop turn are published as one batch. Sync
runs make each a task of LangGraph's thread pool, whose size is the run config's
``max_concurrency`` (``min(32, cpu + 4)`` by default): a sync fan-out wider than that
runs in waves, so pass ``{"max_concurrency": N}`` for wide ones (logged once when a
fan-out is wider than the pool).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from orchestrator import fairshare
from orchestrator.call import CallSite, PreparedCall, owning_message, prepare
from orchestrator.dispatch.ahead import Ahead, Ticket
from orchestrator.dispatch.base import Dispatcher
from orchestrator.dispatch.fleet import dispatcher_for
from orchestrator.messages import (
    answer_invalid_calls,
    command_from,
    error_message,
    not_sendable_text,
    result_message,
    unknown_tool_text,
    unserved_text,
)
from orchestrator.observe import CallObserver
from orchestrator.offering import ToolOffer
from orchestrator.placement import Placement, PlacementRules, describe, takes_arguments
from orchestrator.tools import RemoteTool
from orchestrator.tracing import untraced_steps_inline
from tool_workers.contract.errors import ResultTimeout, RunDeadlineExceeded
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import task_id_for
from tool_workers.contract.wire_json import NotJSONError

log = logging.getLogger("toolfleet.orchestrator")

T = TypeVar("T")

POLL = 0.25
"""Seconds between registry reads while a call waits for a worker serving its tool."""

MEMORY = 4096
"""Calls answered, remembered to tell an outer middleware's retry of one."""

SYNC_POOL = min(32, (os.cpu_count() or 1) + 4)
"""The threads LangGraph runs a sync superstep's tasks in when ``max_concurrency`` is
unset (``ThreadPoolExecutor``'s default size)."""


class _Wait:
    """Route of a call whose tool no worker serves yet: it waits for one to appear."""


WAIT = _Wait()

Decided = Literal["local"] | ToolMessage | PreparedCall
"""Where a call goes: here, answered in its place, or to the workers."""

Route = Decided | _Wait

Output = ToolMessage | Command[Any]


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
        eager_dispatch: bool | None = None,
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
            eager_dispatch: No longer has an effect (each call is published by its own
                Send task; wide sync fan-outs take ``max_concurrency`` in the run
                config). Deprecated.
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
        # create_agent wraps the async hooks in LangSmith's traceable: untraced, its
        # setup and end run on the loop instead of two executor hops per hook call.
        untraced_steps_inline()
        if eager_dispatch is not None:
            warnings.warn(
                "eager_dispatch has no effect: each call is published by its own Send task "
                "(pass max_concurrency in the run config for wide sync fan-outs)",
                DeprecationWarning,
                stacklevel=2,
            )
        self._dispatcher = dispatcher if dispatcher is not None else dispatcher_for(app)
        settings = self._dispatcher.settings
        self.unserved_wait = settings.unserved_wait if unserved_wait is None else unserved_wait
        self.rules = PlacementRules(placement, configured=self._dispatcher.policies.tools)
        self._delivered: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._retry_of: dict[str, str] = {}
        self._placements_seen: set[frozenset[str]] = set()
        self._offer = ToolOffer(self._dispatcher) if discover else None
        self._said_pool = False
        self._ahead = Ahead(self._dispatcher)

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

    # -- the tool hooks: one flow, sync and async ----------------------------------------

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Output]
    ) -> Output:
        """Run the call on the workers, or here (a wide fan-out's first call publishes its
        siblings ahead: see :mod:`orchestrator.dispatch.ahead`)."""
        site = CallSite.of(request)
        ticket = self._ahead.enter(site.fan_out_key, site.call_id)
        try:
            return _blocking(self._call(request, handler, site, ticket))
        finally:
            self._ahead.leave(ticket)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[Output]],
    ) -> Output:
        """Run the call on the workers (batched with this loop turn's calls), or here."""
        return await self._call(request, handler, CallSite.of(request), None)

    async def _call(
        self,
        request: ToolCallRequest,
        handler: Callable[..., Any],
        site: CallSite,
        ticket: Ticket | None,
    ) -> Output:
        """A call from its hook to its answer, sync or async: each step that waits is
        :func:`_either` side. ``ticket`` is a sync hook's place in its fan-out (``None``:
        an async hook); a sync hook runs this to its end at once (:func:`_blocking`)."""
        sync, dispatcher = ticket is not None, self._dispatcher
        served = (dispatcher.served_tools, dispatcher.served_tools_async)
        route = self._route(site, await _either(sync, *served))
        until = self._wait_until(site)
        while isinstance(route, _Wait) and time.monotonic() < until:
            await _either(
                sync, time.sleep, asyncio.sleep, min(POLL, max(until - time.monotonic(), 0.0))
            )
            route = self._route(site, await _either(sync, *served))
        route = self._after_waiting(site, route)
        if route == "local":
            return cast(Output, await _either(sync, handler, handler, request))
        if isinstance(route, ToolMessage):
            return route
        async with _Observing(CallObserver(site, route, dispatcher.timings), sync) as seen:
            call = seen.call
            if site.passed():
                raise _deadline_error(call, before=True)
            # The tenant's turn (a run of the service): its other calls may be ahead.
            gate, tenant = _gate_of(site)
            acquire = (gate.acquire_sync, gate.acquire) if gate is not None else None
            if acquire is not None and not await _either(sync, *acquire, tenant, site.remaining()):
                raise _deadline_error(call, before=True)
            try:
                seen.publishing()
                if ticket is not None:
                    self._send(request, site, ticket, seen, gated=gate is not None)
                else:
                    await dispatcher.submit_async(call, seen.on_state)
                seen.dispatched()
                result = await _either(sync, dispatcher.wait, dispatcher.wait_async, call)
            except ResultTimeout as exc:
                await _either(
                    sync, dispatcher.cancel, dispatcher.cancel_async, [call], terminate=True
                )
                seen.cancelled()
                raise _deadline_error(call, before=False, cause=exc) from exc
            except asyncio.CancelledError:
                if sync or site.handed_on:  # another replica goes on with the run: the call too
                    raise
                # The run was cancelled (or a sibling failed): nothing keeps working for it.
                seen.cancelled()
                await dispatcher.cancel_async([call], terminate=True)
                raise
            finally:
                if gate is not None:
                    gate.release(tenant)
            output = self._finish(call, result)
            await _either(sync, seen.finished, seen.afinished, result, output)
        return output

    def _send(
        self,
        request: ToolCallRequest,
        site: CallSite,
        ticket: Ticket,
        seen: CallObserver,
        *,
        gated: bool,
    ) -> None:
        """A sync hook publishes its call, unless it went ahead of its hook; then, at a
        wide fan-out's first call, the siblings that may go ahead of theirs."""
        call = seen.call
        early = ticket.early
        if (
            early is None
            or early.call.task_id != call.task_id
            or not self._ahead.attach(ticket, seen.on_state)
        ):
            self._dispatcher.submit([call], seen.on_state)
        # After its own call is out: a broker that cannot be reached fails this
        # call within its own publication window, as without siblings ahead.
        if not gated and call.trace is None:
            try:
                self._publish_ahead(request, site)
            except Exception:  # publishing ahead only saves time: this call goes on
                log.warning("could not publish a fan-out's calls ahead", exc_info=True)
        else:
            self._note_pool(site)

    def _publish_ahead(self, request: ToolCallRequest, site: CallSite) -> None:
        """At a fan-out's first call, publish its siblings that may go before their own
        hooks: idempotent, needing nothing injected, routed to the workers now. Only
        when the fan-out is wider than the threads LangGraph runs it on."""
        pool = site.config.get("max_concurrency") or SYNC_POOL
        if site.fan_out <= pool or not self._ahead.lead(site.fan_out_key):
            return
        message = owning_message(site.state, site.call_id)
        if message is None or site.fan_out_key is None:
            return
        # ToolRuntime.tools: the tools node's own tools, as the siblings' hooks get them.
        runtime = request.runtime
        tools = {t.name: t for t in (runtime.tools if runtime is not None else [])}
        served = self._dispatcher.served_tools()
        early: list[PreparedCall] = []
        for sibling in message.tool_calls:
            if sibling.get("id") == site.call_id or sibling["name"] not in served:
                continue
            tool = tools.get(sibling["name"])
            other = CallSite.of(
                ToolCallRequest(
                    tool_call=sibling, tool=tool, state=request.state, runtime=request.runtime
                )
            )
            route = self._route(other, served, ahead=True)
            if (
                isinstance(route, PreparedCall)
                and route.injected is None
                and route.idempotent(self._dispatcher.policies)
            ):
                early.append(route)
        sent = self._ahead.publish(site.fan_out_key, early)
        left = site.fan_out - sent
        if left > pool:
            self._note_pool(site, left)

    # -- the decisions -------------------------------------------------------------------

    def _route(
        self, site: CallSite, served: Mapping[str, ToolSpec], *, ahead: bool = False
    ) -> Route:
        """Where the call goes, given the tools served now.

        :data:`WAIT`: it belongs to the workers, none serves it yet, and it may wait
        (``unserved_wait``, bounded by the run's deadline) for one to appear; or, asked
        ``ahead`` of the call's own hook, it is an outer middleware's retry (the hook
        routes those).
        """
        name = site.name
        placement, _ = self.rules.decide(name, site.tool, served)
        if placement == "local":
            return "local"
        spec = served.get(name)
        if spec is None:
            if site.tool is None:  # not a tool of this agent: no worker will bring it
                log.warning("call %s to unknown tool %s", site.call_id, name)
                return error_message(
                    name, site.call_id, "unknown_tool", unknown_tool_text(name, served)
                )
            return WAIT
        spec = self._version(site, spec)
        if spec is None:  # the schema the call was made with is not served (yet, or now)
            return WAIT
        try:
            call = prepare(site, spec)
        except NotJSONError as exc:
            return error_message(name, site.call_id, "context", not_sendable_text(exc))
        # Called again for a call it already answered: an outer middleware retries it.
        attempt = self._delivered.get(call.task_id, 0)
        if attempt and ahead:
            return WAIT
        if attempt:
            retry_id = task_id_for(f"{call.task_id}\x1fretry:{attempt}")
            self._retry_of[retry_id] = call.task_id
            call = replace(call, task_id=retry_id, attempt=attempt)
        return call

    def _version(self, site: CallSite, shown: ToolSpec) -> ToolSpec | None:
        """The served version of the tool a call runs on: the one the model was shown (a
        fleet tool's schema), else the first that takes the call's arguments."""
        versions = self._dispatcher.served_versions(site.name) or {shown.version: shown}
        tool = site.tool
        if isinstance(tool, RemoteTool) and tool.spec.version in versions:
            return versions[tool.spec.version]
        for spec in versions.values():
            if takes_arguments(spec.parameters, site.args):
                return spec
        return None

    def _wait_until(self, site: CallSite) -> float:
        """Until when (monotonic) an unserved call may wait for a worker: ``unserved_wait``
        at most, never past the run's deadline."""
        until = time.monotonic() + self.unserved_wait
        return until if site.deadline is None else min(until, site.deadline)

    def _after_waiting(self, site: CallSite, route: Route) -> Decided:
        """A call still unserved after its wait: the run's deadline, or an error answer.

        Raises:
            RunDeadlineExceeded: the run's deadline passed while the call waited.
        """
        if not isinstance(route, _Wait):
            return route
        if site.passed():
            raise RunDeadlineExceeded(f"run deadline passed before a worker served {site.name}")
        log.warning("call %s to %s not dispatched: unserved", site.call_id, site.name)
        return error_message(
            site.name, site.call_id, "unserved", unserved_text(site.name, self.unserved_wait)
        )

    def _finish(self, call: PreparedCall, result: ToolResult) -> Output:
        """The call's output: its ToolMessage, or the Command the tool returned."""
        key = self._retry_of.pop(call.task_id, call.task_id)
        self._delivered[key] = self._delivered.get(key, 0) + 1
        self._delivered.move_to_end(key)
        while len(self._delivered) > MEMORY:
            self._delivered.popitem(last=False)
        if result.command is not None:
            return command_from(result.command, call.tool, call.call_id)
        return result_message(call, result)

    def _note_pool(self, site: CallSite, left: int | None = None) -> None:
        """Say once when a sync fan-out's calls that could not go ahead (``left``: all
        of them by default) are more than LangGraph's pool runs at a time."""
        if self._said_pool or site.fan_out <= 1:
            return
        pool = site.config.get("max_concurrency") or SYNC_POOL
        left = site.fan_out if left is None else left
        if left > pool:
            self._said_pool = True
            log.warning(
                "%d of a sync fan-out's %d tool calls run at most %d at a time (LangGraph's "
                "thread pool; calls that are not idempotent, need injected state, or run "
                "traced are not published ahead); pass {'max_concurrency': %d} in the run "
                "config to send them all at once",
                left,
                site.fan_out,
                pool,
                site.fan_out,
            )

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


def _gate_of(site: CallSite) -> tuple[fairshare.CallGate | None, str]:
    """The process's call gate and the run's tenant, when both are there (a run of
    ``toolfleet serve``); else ``(None, "")``: the call goes out at once."""
    gate = fairshare.installed()
    tenant = fairshare.tenant_of(site.config) if gate is not None else None
    return (gate, tenant) if gate is not None and tenant is not None else (None, "")


def _deadline_error(
    call: PreparedCall, *, before: bool, cause: Exception | None = None
) -> RunDeadlineExceeded:
    """The run's deadline error; ``cause`` (the wait's timeout) names a cut, if one
    held the call up."""
    when = "before" if before else "while"
    verb = "could run" if before else "ran"
    why = f" ({cause})" if cause is not None else ""
    return RunDeadlineExceeded(f"run deadline passed {when} {call.tool} {verb}{why}")


async def _either(
    sync: bool, blocking: Callable[..., Any], awaited: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """One step of a call that waits: ``blocking`` for a sync hook, ``awaited`` for an
    async one."""
    if sync:
        return blocking(*args, **kwargs)
    return await awaited(*args, **kwargs)


def _blocking(flow: Coroutine[Any, Any, T]) -> T:
    """What a coroutine whose every step blocks (it never suspends) returns, run here
    and now, with no event loop."""
    try:
        flow.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    flow.close()
    raise RuntimeError("a sync hook's call was suspended")


class _Observing:
    """``async with`` over a call's observer: its sync side for a sync hook."""

    def __init__(self, seen: CallObserver, sync: bool) -> None:
        self._seen, self._sync = seen, sync

    async def __aenter__(self) -> CallObserver:
        if self._sync:
            return self._seen.__enter__()
        return await self._seen.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        await _either(self._sync, self._seen.__exit__, self._seen.__aexit__, *exc_info)
