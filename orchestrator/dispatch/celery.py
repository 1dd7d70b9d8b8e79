"""The Celery dispatcher: tool calls as Celery tasks, results from the backend's pub/sub.

A call is published at most once. Its task id is derived from its identity, and a
``SET NX`` marker guards the send: a second dispatch of the same call, from this
process or a restarted one, attaches to the first instead of running the tool again
(Celery itself would run a task twice if it were sent twice with the same id).

Sync and async callers share every decision; they differ only in how they wait: a
sync caller blocks on the call's future, an async one awaits it, and every blocking
Redis or broker round trip an async caller needs runs on this dispatcher's own I/O
threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis
from celery import Celery

from orchestrator.calls import PreparedCall
from orchestrator.dispatch.base import PlacementTable
from orchestrator.dispatch.batches import Publications
from orchestrator.dispatch.listener import ResultListener
from orchestrator.dispatch.outcome import result_from_meta
from orchestrator.dispatch.publish import Publisher
from orchestrator.dispatch.registry import RegistryView, note_placement
from orchestrator.dispatch.timings import CallTimings
from orchestrator.dispatch.watch import StateCallback
from orchestrator.messages import hung_text
from tool_workers.contract.connections import redis_client, redis_connection_kwargs, socket_options
from tool_workers.contract.errors import ConfigError, ResultTimeout
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import reply_channel, revoked_key
from tool_workers.contract.settings import Settings, ToolPolicies

log = logging.getLogger("toolfleet.dispatch")

T = TypeVar("T")

CHECK_INTERVAL = 5.0
"""Seconds between a waiter's checks that its call is still owned by someone."""

ORPHAN_GRACE = 300.0
"""Seconds a finished call published eagerly may wait for its Send task to collect it."""


class CeleryDispatcher:
    """Publishes calls as Celery tasks and waits on the result backend's pub/sub."""

    def __init__(self, app: Celery, settings: Settings, *, owns_app: bool = False) -> None:
        """
        Args:
            app: The Celery app calls are published with.
            settings: This process's settings.
            owns_app: Close ``app`` with this dispatcher (its broker connections are the
                dispatcher's own either way, and closed with it).
        """
        self.app = app
        self.settings = settings
        self._owns_app = owns_app
        self.policies = _read_policies(settings)
        self._redis = redis_client(settings.backend_url, settings)
        self._registry = RegistryView(redis_client(settings.own_redis_url, settings), settings)
        channel = reply_channel(settings.key_prefix, uuid.uuid4().hex)
        self._publisher = Publisher(app, settings, self._redis, reply_to=channel)
        self.listener = ResultListener(
            settings.backend_url,
            app.backend.get_key_for_task,
            {**socket_options(settings), **redis_connection_kwargs(settings.backend_url, settings)},
            reply_channel=channel,
        )
        self._lock = threading.Lock()
        self._futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        self._calls: dict[str, PreparedCall] = {}
        self._finished_at: dict[str, float] = {}
        self._publications = Publications(self._publisher, self.listener, settings, self._forget)
        # Blocking round trips of async callers (registry reads, revokes, ownership
        # checks): threads of their own, so they never wait behind a publication.
        self._io_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="toolfleet-io"
        )
        self._timings: CallTimings | None = None

    @property
    def timings(self) -> CallTimings | None:
        """Set to time this process's calls (``toolfleet serve``'s ``/metrics``)."""
        return self._timings

    @timings.setter
    def timings(self, timings: CallTimings | None) -> None:
        self._timings = self._publications.timings = timings

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, fn, *args)

    # -- registry -------------------------------------------------------------------------

    def served_tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves now (cached for a second unless ``fresh``)."""
        return self._registry.tools(fresh=fresh)

    async def served_tools_async(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """:meth:`served_tools`; a read that must go to Redis runs off the event loop."""
        if not fresh and self._registry.read_once:
            return self._registry.tools()  # a stale map is refreshed in the background
        return await self._off_loop(functools.partial(self._registry.tools, fresh=fresh))

    def registry(self) -> RegistryView:
        """The registry view this dispatcher routes with."""
        return self._registry

    def note_placement(self, table: PlacementTable) -> None:
        """Publish an agent's tool placement for ``toolfleet status`` (best effort)."""
        note_placement(self._redis, self.settings.key_prefix, table)

    async def note_placement_async(self, table: PlacementTable) -> None:
        """:meth:`note_placement` off the event loop."""
        await self._off_loop(self.note_placement, table)

    # -- publishing ---------------------------------------------------------------------

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Watch and publish every call this process has not watched yet.

        Raises:
            DispatchError: the broker refused the messages.
        """
        fresh = self._watch(calls, on_state)
        if fresh:
            self._publications.publish(fresh)

    def submitted(self, task_id: str) -> PreparedCall | None:
        """The call published under ``task_id`` that this process still waits on."""
        with self._lock:
            return self._calls.get(task_id)

    async def submit_async(self, call: PreparedCall, on_state: StateCallback | None = None) -> None:
        """Publish ``call`` together with every call submitted in the same loop turns
        (:class:`~orchestrator.dispatch.batches.Publications`).

        Raises:
            DispatchError: the broker refused the messages.
        """
        if not self.listener.started:
            await self._off_loop(self.listener.start)  # waits for the thread: not here
        if not self._watch([call], on_state):
            return
        await self._publications.join(call)

    def _watch(
        self, calls: Sequence[PreparedCall], on_state: StateCallback | None
    ) -> list[PreparedCall]:
        """Start watching the calls not watched yet; those are the ones to publish."""
        self._reap_orphans()
        with self._lock:
            fresh = [c for c in calls if c.task_id not in self._futures]
            if not fresh:
                return []
            self._publications.publishing_again(c.task_id for c in fresh)
            if self._timings is not None:
                on_state = self._timings.observing(on_state)
            # Published with this process's reply channel: no channel per call.
            futures = self.listener.watch([c.task_id for c in fresh], on_state, subscribe=False)
            self._futures.update(futures)
            self._calls.update((c.task_id, c) for c in fresh)
        for task_id, future in futures.items():
            future.add_done_callback(functools.partial(self._mark_finished, task_id))
        return fresh

    def _mark_finished(self, task_id: str, _future: object = None) -> None:
        with self._lock:
            if task_id in self._futures:
                self._finished_at[task_id] = time.monotonic()

    def _reap_orphans(self) -> None:
        """Drop results nobody collected: calls published eagerly whose Send never came."""
        horizon = time.monotonic() - ORPHAN_GRACE
        with self._lock:
            stale = [t for t, at in self._finished_at.items() if at < horizon]
        self._publications.forget_older_than(horizon)
        for task_id in stale:
            log.info("dropping uncollected result of call %s", task_id)
            self._forget(task_id)

    # -- waiting --------------------------------------------------------------------------

    def _future(self, call: PreparedCall) -> concurrent.futures.Future[dict[str, Any]]:
        with self._lock:
            future = self._futures.get(call.task_id)
        if future is None:
            self.submit([call])
            with self._lock:
                future = self._futures[call.task_id]
        return future

    def _still_owned(self, call: PreparedCall) -> None:
        """Republish a call whose publisher died between claiming and publishing it."""
        try:
            if self._publisher.abandoned(call):
                log.warning("call %s was claimed but never published; publishing it", call.task_id)
                self.listener.subscribe([c.task_id for c in self._publisher.publish([call])])
        except redis.RedisError as exc:  # Redis restarting: check again next interval
            log.warning("could not check call %s: %r", call.task_id, exc)

    def wait(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Block until the call's result is in.

        A call whose policy has an ``idle_timeout`` and that shows no life (progress,
        heartbeats) for that long once started is revoked and answered as hung.

        Raises:
            ResultTimeout: no result within ``timeout`` seconds.
        """
        future = self._future(call)
        deadline = _deadline(timeout)
        try:
            while True:
                try:
                    meta = future.result(self._step(call, deadline))
                    break
                except concurrent.futures.TimeoutError:
                    hung = self._between_steps(call, deadline)
                    if hung is not None:
                        self._revoke([call.task_id], terminate=True)
                        return hung
                    self._still_owned(call)
        finally:
            self._forget(call.task_id)
        return result_from_meta(
            meta,
            call.tool,
            call.spec,
            task_id=call.task_id,
            signing_key=self.settings.signing_key,
        )

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await the call's result on the running event loop (see :meth:`wait`).

        Raises:
            ResultTimeout: no result within ``timeout`` seconds.
        """
        with self._lock:
            watched = call.task_id in self._futures
        if not watched:  # never submitted (a RemoteTool invoked directly): publish it now
            await self.submit_async(call)
        future = asyncio.wrap_future(self._future(call))
        deadline = _deadline(timeout)
        try:
            while True:
                # asyncio.wait, unlike wait_for, neither wraps the future in a task nor
                # cancels it on a timeout.
                await asyncio.wait((future,), timeout=self._step(call, deadline))
                if future.done():
                    meta = future.result()
                    break
                hung = self._between_steps(call, deadline)
                if hung is not None:
                    await self._off_loop(self._revoke, [call.task_id], True)
                    return hung
                await self._off_loop(self._still_owned, call)
        finally:
            self._forget(call.task_id)
        return result_from_meta(
            meta,
            call.tool,
            call.spec,
            task_id=call.task_id,
            signing_key=self.settings.signing_key,
        )

    @staticmethod
    def _step(call: PreparedCall, deadline: float | None) -> float:
        """How long to wait before the next check: the ownership check, the idle timeout
        and the caller's deadline, whichever comes first."""
        step = CHECK_INTERVAL
        idle = call.idle_timeout
        if idle is not None:
            step = min(step, max(idle / 4, 0.05))
        if deadline is not None:
            step = min(step, max(deadline - time.monotonic(), 0.0))
        return step

    def _between_steps(self, call: PreparedCall, deadline: float | None) -> ToolResult | None:
        """After a step without a result: raise past the deadline, answer a hung call.

        Raises:
            ResultTimeout: the caller's deadline passed.
        """
        if deadline is not None and time.monotonic() >= deadline:
            raise ResultTimeout(f"no result for {call.tool} call {call.call_id}")
        return self._hung(call)

    def _hung(self, call: PreparedCall) -> ToolResult | None:
        """An error result when a started call outlived its idle timeout (the caller
        revokes it)."""
        idle = call.idle_timeout
        last = self.listener.last_activity(call.task_id) if idle is not None else None
        if idle is None or last is None or time.monotonic() - last < idle:
            return None
        log.warning("call %s to %s silent for %gs: revoking it", call.call_id, call.tool, idle)
        return ToolResult.error("hung", hung_text(call.tool, idle))

    def _forget(self, task_id: str) -> None:
        if self._timings is not None:
            self._timings.forget(task_id)
        with self._lock:
            self._calls.pop(task_id, None)
            self._finished_at.pop(task_id, None)
            if self._futures.pop(task_id, None) is None:
                return
        self.listener.release(task_id)

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Revoke the calls (terminating them on prefork workers) and stop waiting."""
        ids = [c.task_id for c in calls]
        if ids:
            self._revoke(ids, terminate)
            self._forget_all(ids)

    async def cancel_async(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """:meth:`cancel`; the revoke broadcast is sent off the event loop.

        The broadcast is handed to this dispatcher's I/O threads before the first await
        and shielded: a caller cancelled again while it waits (a run torn down, a loop
        shutting down) does not stop the revocation.
        """
        ids = [c.task_id for c in calls]
        if ids:
            revoking = self._io_pool.submit(self._revoke, ids, terminate)
            self._forget_all(ids)
            await asyncio.shield(asyncio.wrap_future(revoking))

    def _revoke(self, ids: list[str], terminate: bool) -> None:
        ids = self._publications.revocable(ids)  # a call not published has nothing to revoke
        if not ids:
            return
        # Recorded before the broadcast: a worker that misses the broadcast (down, or
        # started later) reads this before it starts the call, and does not run it.
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    key = revoked_key(self.settings.key_prefix, task_id)
                    pipe.set(key, "1", ex=self.settings.result_expires)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not record the revocation of %d call(s): %r", len(ids), exc)
        try:
            self.app.control.revoke(ids, terminate=terminate, signal="SIGTERM")
        except Exception as exc:  # revocation is best effort; the run is ending anyway
            log.warning("could not revoke %d call(s): %r", len(ids), exc)

    def _forget_all(self, ids: Sequence[str]) -> None:
        for task_id in ids:
            self._forget(task_id)

    def in_flight(self) -> int:
        """Calls this process is waiting on."""
        with self._lock:
            return len(self._futures)

    def close(self) -> None:
        """Stop the result listener and drop connections."""
        self.listener.close()
        self._registry.close()
        self._publications.shutdown()
        self._io_pool.shutdown(wait=False)
        self._redis.close()
        self._publisher.close()
        if self._owns_app:
            self.app.close()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _read_policies(settings: Settings) -> ToolPolicies:
    try:
        return settings.policies()
    except ConfigError as exc:
        log.warning("tool policy not readable (%s); no tool is placed by it", exc)
        return ToolPolicies()
