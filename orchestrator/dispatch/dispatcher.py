"""The Celery dispatcher: tool calls out as Celery tasks, results back on a reply channel.

A call is published at most once (:mod:`.publish`): its task id is derived from its
identity and its marker guards the send, so a second dispatch of the same call, from
this process or a restarted one, attaches to the first instead of running the tool
again. Its result comes back on this dispatcher's reply channel (:mod:`.listener`).

Sync and async callers share every decision (:mod:`.waiting`, :mod:`.publish`); they
differ only in how they wait and where their I/O runs: a sync caller in its own thread,
an async caller on its event loop, with the few blocking round trips it needs (the
first registry read, a revocation's broadcast, RabbitMQ's producer) in this
dispatcher's two I/O threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import redis
from celery import Celery

from orchestrator.call import PreparedCall
from orchestrator.dispatch.base import PlacementTable
from orchestrator.dispatch.late import LostCalls
from orchestrator.dispatch.link import LinkHealth, worst
from orchestrator.dispatch.listener import ResultListener
from orchestrator.dispatch.loop_redis import LoopClients
from orchestrator.dispatch.outcome import result_from_meta
from orchestrator.dispatch.publish import AmqpBroker, Outcome, Publisher
from orchestrator.dispatch.registry import RegistryView, note_placement
from orchestrator.dispatch.timings import CallTimings
from orchestrator.dispatch.waiting import Next, Waiting, deadline_of
from orchestrator.dispatch.watch import StateCallback
from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import async_redis_client, redis_client
from tool_workers.contract.epoch import (
    EpochWatch,
    note_loss,
    read_epoch,
    records_lost_text,
    renew_epoch,
)
from tool_workers.contract.errors import ConfigError, DispatchError, ToolfleetError
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import queue_key, reply_channel, result_key
from tool_workers.contract.settings import Settings, ToolPolicies

log = logging.getLogger("toolfleet.dispatch")

T = TypeVar("T")

SENT_MEMORY = 65_536
"""Published calls remembered for their cancellation (flat memory, however many calls)."""

READY_WAIT = 2.0
"""Seconds the first publication waits for the reply channel's subscription; past that
it publishes anyway (the listener's sweep reads what the channel missed)."""

VERDICT = "TOOLFLEET_VERDICT"
"""State of a meta this dispatcher resolves a call's future with itself (its ``verdict``,
a :class:`ToolResult`, is the answer): a call whose records Redis lost."""

EPOCH_READ_INTERVAL = 1.0
"""Seconds between the ownership checks' reads of the epoch (one read serves them all)."""

REVOKE_WAIT = 1.0
"""Seconds a cancellation waits for its revocation (a round trip when Redis answers);
past that it goes on in the background, so a cut never holds up a run's end."""


class CeleryDispatcher:
    """Publishes calls as Celery tasks and collects their results.

    Args:
        app: A Celery app of the fleet (built from ``settings`` when ``None``): its
            queue table names RabbitMQ's queues, and its control API revokes calls.
        settings: This process's settings.
        owns_app: Close ``app`` with this dispatcher.
    """

    timings: CallTimings | None = None
    """Set to time this process's calls (``toolfleet serve``'s ``/metrics``)."""

    def __init__(self, app: Celery | None, settings: Settings, *, owns_app: bool = False) -> None:
        self.settings = settings
        self.policies = _read_policies(settings)
        self._app = app
        self._owns_app = owns_app or app is None
        self._app_lock = threading.Lock()
        self._redis = redis_client(settings.backend_url, settings)
        self._loop_clients = LoopClients(lambda: async_redis_client(settings.backend_url, settings))
        self._registry = RegistryView(redis_client(settings.own_redis_url, settings), settings)
        namespace = settings.namespace
        channel = reply_channel(settings.key_prefix, uuid.uuid4().hex[:16])
        self.listener = ResultListener(
            lambda: async_redis_client(settings.backend_url, settings),
            functools.partial(result_key, namespace),
            channel,
        )
        self._publish_link = LinkHealth()
        # Blocking round trips of async callers: threads of their own, never the loop.
        self._io = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="toolfleet-io"
        )
        self._amqp = AmqpBroker(self.app, self._io) if settings.broker_is_amqp else None
        self.lost = LostCalls(
            self._redis,
            settings.key_prefix,
            settings.result_expires,
            self._io,
            settings.signing_key,
        )
        """The calls answered as lost, and the late notices of their results."""
        self.listener.on_late = self.lost.heard
        self._publisher = Publisher(
            settings,
            self._redis,
            self._loop_clients,
            channel,
            functools.partial(result_key, namespace),
            functools.partial(queue_key, namespace),
            self.policies.defaults.queue,
            self._amqp,
            self._published,
            self._publish_link,
        )
        self._lock = threading.Lock()
        self._futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        self._calls: dict[str, PreparedCall] = {}
        self._sent: collections.OrderedDict[str, str] = collections.OrderedDict()
        """Calls this process published (or found published), with the epoch their
        messages named: the ones a cancellation revokes. The most recent
        :data:`SENT_MEMORY`."""
        self._checking: set[str] = set()
        """Calls whose ownership check is in progress (one at a time per call)."""
        self._epoch_read_at = float("-inf")
        self.epochs = EpochWatch("orchestrator")
        """The epoch of toolfleet's records this process saw last
        (:mod:`tool_workers.contract.epoch`): its losses are counted there."""

    @property
    def app(self) -> Celery:
        """The fleet's Celery app (made on first use when none was given)."""
        with self._app_lock:
            if self._app is None:
                self._app = create_app(self.settings, self.policies)
            return self._app

    # -- registry -------------------------------------------------------------------------

    def served_tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves now (cached for a second unless ``fresh``)."""
        return self._registry.tools(fresh=fresh)

    async def served_tools_async(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """:meth:`served_tools`; a read that must go to Redis runs off the event loop."""
        if not fresh and self._registry.read_once:
            return self._registry.tools()  # a stale map is refreshed in the background
        return await self._off_loop(functools.partial(self._registry.tools, fresh=fresh))

    def served_versions(self, name: str) -> Mapping[str, ToolSpec]:
        """Every served version of ``name`` in the registry map last read (no I/O)."""
        return self._registry.versions(name)

    def registry(self) -> RegistryView:
        """The registry view this dispatcher routes with."""
        return self._registry

    def note_placement(self, table: PlacementTable) -> None:
        """Publish an agent's tool placement for ``toolfleet status`` (best effort)."""
        note_placement(self._redis, self.settings.key_prefix, table)

    async def note_placement_async(self, table: PlacementTable) -> None:
        """:meth:`note_placement` off the event loop."""
        await self._off_loop(self.note_placement, table)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    # -- publishing -----------------------------------------------------------------------

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Publish every call this process does not wait on yet; returns once they are
        on the broker.

        Raises:
            DispatchError: the broker refused them.
        """
        fresh = self._watch(calls, on_state)
        if not fresh:
            return
        if not self.epochs.known:
            self._read_epoch()
        self.listener.wait_ready(_bounded(READY_WAIT, fresh))
        try:
            outcomes = self._publisher.publish(fresh)
        except BaseException as exc:
            self._publication_failed(fresh)
            _raise_as_dispatch_error(exc)
        self._after(outcomes)

    async def submit_async(self, call: PreparedCall, on_state: StateCallback | None = None) -> None:
        """Publish ``call`` together with the calls of the same loop turns.

        Raises:
            DispatchError: the broker refused them.
        """
        if not self.listener.started:
            await self._off_loop(self.listener.start)  # waits for the thread: not here
        if not self._watch([call], on_state):
            return
        if not self.epochs.known:
            await self._off_loop(self._read_epoch)
        if not self.listener.ready:
            await self._off_loop(self.listener.wait_ready, _bounded(READY_WAIT, [call]))
        try:
            # The publication is the batch's: it goes on if this caller is cancelled (a
            # cancellation of the call waits for its end).
            outcome = await self._publisher.publish_async(call)
        except BaseException as exc:
            self._publication_failed([call])
            _raise_as_dispatch_error(exc)
        self._after({call.task_id: outcome})

    def _watch(
        self, calls: Sequence[PreparedCall], on_state: StateCallback | None
    ) -> list[PreparedCall]:
        """Start watching the calls not watched yet: those are the ones to publish."""
        with self._lock:
            fresh = [c for c in calls if c.task_id not in self._futures]
            if not fresh:
                return []
            futures = self.listener.watch([c.task_id for c in fresh], on_state)
            self._futures.update(futures)
            self._calls.update((c.task_id, c) for c in fresh)
        return fresh

    def _published(self, outcomes: Mapping[str, Outcome]) -> None:
        """Calls on the queue now: the ones a cancellation revokes."""
        with self._lock:
            for task_id, outcome in outcomes.items():
                if outcome is Outcome.STORED:
                    continue
                self._sent[task_id] = self._publisher.epoch
                self._sent.move_to_end(task_id)
            while len(self._sent) > SENT_MEMORY:
                self._sent.popitem(last=False)

    def _publication_failed(self, calls: Sequence[PreparedCall]) -> None:
        """Stop waiting on calls whose publication failed (or whose caller was cancelled
        while it went on: its end decides whether a cancellation revokes them)."""
        for call in calls:
            self._forget(call.task_id)

    def _after(self, outcomes: Mapping[str, Outcome]) -> None:
        """Calls published by someone else, or answered already: read their results
        (their states are not on this process's reply channel)."""
        elsewhere = [t for t, o in outcomes.items() if o is not Outcome.PUBLISHED]
        self.listener.read_now(elsewhere)

    # -- waiting --------------------------------------------------------------------------

    def _future(self, call: PreparedCall) -> concurrent.futures.Future[dict[str, Any]]:
        with self._lock:
            future = self._futures.get(call.task_id)
        if future is None:
            self.submit([call])
            with self._lock:
                future = self._futures[call.task_id]
        return future

    def wait(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Block until the call's result is in (publishing it first if need be).

        A call whose policy has an ``idle_timeout`` and that shows no life for that long
        once started is revoked and answered as hung.

        Raises:
            ResultTimeout: no result by the call's deadline or within ``timeout``.
        """
        future = self._future(call)
        waiting = self._waiting(call, timeout)
        try:
            while True:
                try:
                    meta = future.result(waiting.step())
                    break
                except concurrent.futures.TimeoutError:
                    given_up = self._between(call, waiting)
                    if given_up is not None:
                        self._revoke([call.task_id], terminate=True)
                        return given_up
        finally:
            self._forget(call.task_id)
        return self._result(call, meta)

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await the call's result on the running event loop (see :meth:`wait`).

        Raises:
            ResultTimeout: no result by the call's deadline or within ``timeout``.
        """
        with self._lock:
            watched = call.task_id in self._futures
        if not watched:  # never submitted (a RemoteTool invoked directly): publish it now
            await self.submit_async(call)
        future = asyncio.wrap_future(self._future(call))
        waiting = self._waiting(call, timeout)
        try:
            while True:
                # asyncio.wait, unlike wait_for, neither wraps the future in a task nor
                # cancels it on a timeout.
                await asyncio.wait((future,), timeout=waiting.step())
                if future.done():
                    meta = future.result()
                    break
                given_up = self._between(call, waiting)
                if given_up is not None:
                    await self._off_loop(self._revoke, [call.task_id], True)
                    return given_up
        finally:
            self._forget(call.task_id)
        return self._result(call, meta)

    def _between(self, call: PreparedCall, waiting: Waiting) -> ToolResult | None:
        """A wait's step ran out: the answer to give up with (the call is then revoked),
        or None to wait on (its result key read soon when the wait says so)."""
        move = waiting.between()
        if move is Next.CHECK:
            self._check_soon(call)
        return move if isinstance(move, ToolResult) else None

    def _waiting(self, call: PreparedCall, timeout: float | None) -> Waiting:
        return Waiting(
            call,
            deadline_of(call, timeout),
            functools.partial(self.listener.last_activity, call.task_id),
            self.link_trouble,
        )

    def link_trouble(self) -> str | None:
        """How long Redis has been unreachable, and why, if it is now (else ``None``)."""
        return worst(self.listener.link, self._publish_link)

    def _check_soon(self, call: PreparedCall) -> None:
        """Check in the background that someone still owns ``call`` (the waiter never
        waits for the check: during a cut it would take the socket timeouts). Not while
        the reply channel is down: the check cannot reach Redis either."""
        if not self.listener.ready:
            return
        with self._lock:
            if call.task_id in self._checking:
                return
            self._checking.add(call.task_id)
        try:
            self._io.submit(self._still_published, call)
        except RuntimeError:  # closed
            with self._lock:
                self._checking.discard(call.task_id)

    def _read_epoch(self) -> None:
        """Read the epoch (written when missing) for the calls' messages; a change from
        the one seen before is a loss of Redis data (logged, counted, noted)."""
        prefix = self.settings.key_prefix
        self._epoch_read_at = time.monotonic()
        since = self.epochs.generation
        try:
            epoch, missing = read_epoch(self._redis, prefix)
        except redis.RedisError as exc:  # the messages go out without one: run as before
            log.warning("could not read the epoch of toolfleet's records: %r", exc)
            return
        if self.epochs.seen(epoch, missing=missing, since=since):
            note_loss(self._redis, prefix, "orchestrator", _how(missing), epoch)
        self._publisher.epoch = self.epochs.known

    def _records_lost(self, call: PreparedCall, stamped: str) -> None:
        """The marker of ``call``, published here under the epoch ``stamped``, is gone
        with no result stored: Redis lost data. When the epoch does not show it (still
        ``stamped``: a replica promoted while behind), it is replaced, so workers refuse
        the call's copies when its tool is not idempotent. The call is answered "may
        have run" when its tool is not idempotent, and published again otherwise."""
        prefix = self.settings.key_prefix
        if stamped and stamped == self.epochs.known:
            since = self.epochs.generation
            epoch = renew_epoch(self._redis, prefix, stamped)
            if self.epochs.lost_marker(epoch, since=since):
                note_loss(self._redis, prefix, "orchestrator", "a published call's marker", epoch)
            self._publisher.epoch = self.epochs.known
        if call.idempotent(self.policies):
            log.warning("Redis lost call %s to %s; publishing it again", call.task_id, call.tool)
            self._after(self._publisher.publish([call]))
            return
        log.error(
            "Redis lost call %s to non-idempotent tool %s: answered as may have run",
            call.task_id,
            call.tool,
        )
        verdict = ToolResult.error("redelivered", records_lost_text(call.tool))
        with self._lock:
            future = self._futures.get(call.task_id)
        if future is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_result({"status": VERDICT, "task_id": call.task_id, "verdict": verdict})

    def _result(self, call: PreparedCall, meta: dict[str, Any]) -> ToolResult:
        verdict = meta.get("verdict") if meta.get("status") == VERDICT else None
        if isinstance(verdict, ToolResult):
            self.lost.answered(call, verdict)
            return verdict
        result = result_from_meta(
            meta,
            call.tool,
            call.spec,
            task_id=call.task_id,
            signing_key=self.settings.signing_key,
        )
        self.lost.answered(call, result)
        return result

    def _still_published(self, call: PreparedCall) -> None:
        """Publish again a call nobody will: its claimer died before publishing it, or
        Redis lost its marker and its message."""
        try:
            if time.monotonic() - self._epoch_read_at >= EPOCH_READ_INTERVAL:
                self._read_epoch()
            if self._publisher.abandoned(call):
                with self._lock:
                    stamped = self._sent.get(call.task_id)
                if stamped is not None:
                    self._records_lost(call, stamped)
                    return
                log.warning(
                    "call %s has neither a marker nor a result; publishing it", call.task_id
                )
                self._after(self._publisher.publish([call]))
        except (redis.RedisError, ToolfleetError) as exc:  # Redis restarting: check again later
            log.warning("could not check call %s: %r", call.task_id, exc)
        finally:
            with self._lock:
                self._checking.discard(call.task_id)

    def _forget(self, task_id: str) -> None:
        if self.timings is not None:
            self.timings.forget(task_id)
        with self._lock:
            self._calls.pop(task_id, None)
            if self._futures.pop(task_id, None) is None:
                return
        self.listener.release(task_id)

    # -- stopping -------------------------------------------------------------------------

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Revoke the calls (terminating them on prefork workers) and stop waiting.

        Waits :data:`REVOKE_WAIT` at most for the revocation: during a cut it goes on in
        the background (a run's deadline is kept; the calls' messages expire with it).
        """
        revoking = self._stop(calls, terminate)
        if revoking is not None:
            concurrent.futures.wait((revoking,), timeout=REVOKE_WAIT)

    async def cancel_async(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """:meth:`cancel`, its round trips off the event loop.

        Handed to the I/O threads before the first await: a caller cancelled again while
        it waits (a run torn down, a loop shutting down) does not stop the revocation.
        Waits :data:`REVOKE_WAIT` at most, as :meth:`cancel` does.
        """
        revoking = self._stop(calls, terminate)
        if revoking is not None:
            # asyncio.wait neither cancels the revocation nor raises on a timeout.
            await asyncio.wait((asyncio.wrap_future(revoking),), timeout=REVOKE_WAIT)

    def _stop(
        self, calls: Sequence[PreparedCall], terminate: bool
    ) -> concurrent.futures.Future[None] | None:
        """Start revoking the calls and stop waiting for them; the revocation, if any."""
        ids = [c.task_id for c in calls]
        if not ids:
            return None
        revoking = self._revoking(ids, terminate)
        for task_id in ids:
            self._forget(task_id)
        return revoking

    def _revoking(self, ids: list[str], terminate: bool) -> concurrent.futures.Future[None] | None:
        """The revocation of ``ids``, started in the I/O threads (``None``: closed)."""
        try:
            return self._io.submit(self._revoke, ids, terminate)
        except RuntimeError:  # closed: nothing runs for this process any more
            return None

    def _revoke(self, ids: list[str], terminate: bool) -> None:
        ids = self._revocable(ids)
        if not ids:
            return
        with self._lock:
            for task_id in ids:
                self._sent.pop(task_id, None)
        # Recorded before the broadcast: a worker that misses the broadcast (down, or
        # started later) reads the record before it starts the call, and does not run it.
        try:
            self._publisher.record_revoked(ids)
        except redis.RedisError as exc:
            log.warning("could not record the revocation of %d call(s): %r", len(ids), exc)
        try:
            self.app.control.revoke(ids, terminate=terminate, signal="SIGTERM")
        except Exception as exc:  # revocation is best effort; the run is ending anyway
            log.warning("could not revoke %d call(s): %r", len(ids), exc)

    def _revocable(self, ids: Sequence[str]) -> list[str]:
        """The calls a cancellation must revoke: those this process published, once the
        publications in progress for any of them have ended.

        A call whose publication failed, or that was never published (its run was
        cancelled first), is not on the queue because of this process: a revocation
        recorded for it would answer it "cancelled" when the run is resumed.
        """
        concurrent.futures.wait(self._publisher.publishing(ids))
        with self._lock:
            return [t for t in ids if t in self._sent]

    def in_flight(self) -> int:
        """Calls this process is waiting on."""
        with self._lock:
            return len(self._futures)

    def data_losses(self) -> int:
        """Losses of toolfleet's records in Redis this process noticed (its epoch watch)."""
        return self.epochs.losses

    def close(self) -> None:
        """Stop the result listener and drop connections."""
        self.listener.close()
        self._publisher.close()
        self._registry.close()
        self._io.shutdown(wait=False)
        self._loop_clients.close()
        self._redis.close()
        if self._amqp is not None:
            self._amqp.close()
        if self._owns_app and self._app is not None:
            self._app.close()


def _how(missing: bool) -> str:
    return "the epoch key was missing" if missing else "the epoch changed"


def _bounded(seconds: float, calls: Sequence[PreparedCall]) -> float:
    """``seconds``, or less: never past the calls' run deadline."""
    left = [c.deadline - time.monotonic() for c in calls if c.deadline is not None]
    return max(min([seconds, *left]), 0.0)


def _raise_as_dispatch_error(exc: BaseException) -> NoReturn:
    """Raise ``exc``; an error of the broker or Redis as a :class:`DispatchError`."""
    if isinstance(exc, ToolfleetError) or not isinstance(exc, Exception):
        raise exc
    raise DispatchError(f"could not publish tool call(s): {exc!r}") from exc


def _read_policies(settings: Settings) -> ToolPolicies:
    try:
        return settings.policies()
    except ConfigError as exc:
        log.warning("tool policy not readable (%s); no tool is placed by it", exc)
        return ToolPolicies()
