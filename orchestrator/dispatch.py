"""Hand tool calls to the workers and collect their results.

:class:`Dispatcher` is the seam at the network boundary: :class:`CeleryDispatcher`
publishes Celery tasks and waits on the result backend; the in-process
:class:`~orchestrator.local_dispatch.InProcessDispatcher` runs tools in threads for
fast tests.

A call is published at most once. Its task id is derived from its identity, and a
``SET NX`` marker guards the send: a second dispatch of the same call, from this
process or a restarted one, attaches to the first instead of running the tool again
(Celery itself would run a task twice if it were sent twice with the same id).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
from celery import Celery

from orchestrator.outcome import result_from_meta
from orchestrator.registry_view import RegistryView
from orchestrator.results import ResultListener, StateCallback
from tool_workers.errors import DispatchError, ResultTimeout
from tool_workers.protocol import ToolRequest, ToolResult, ToolSpec, call_marker_key, task_name
from tool_workers.settings import Settings

log = logging.getLogger("toolfleet.dispatch")

PENDING_MARKER_TTL = 60
"""Seconds a send marker lives before its publish is confirmed: a process that died
between marking and publishing leaves a marker that expires, so the call can be sent."""


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

    def request(self) -> ToolRequest:
        """The wire request for this call."""
        return ToolRequest(
            tool=self.tool,
            call_id=self.call_id,
            args=self.args,
            idempotency_key=self.task_id,
            thread_id=self.thread_id,
            run_id=self.run_id,
        )


@dataclass
class _Batch:
    done: asyncio.Future[None]
    calls: list[PreparedCall] = field(default_factory=list)


class Dispatcher(Protocol):
    """Publishes calls and hands back their results."""

    def served_tools(self) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves now, by name."""
        ...

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Publish every call not yet published; returns once they are on the broker."""
        ...

    def wait(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Block until ``call``'s result is in (submitting it first if needed)."""
        ...

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await ``call``'s result without blocking the event loop."""
        ...

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Revoke calls that are still queued or running and stop waiting for them."""
        ...


class CeleryDispatcher:
    """Publishes calls as Celery tasks and waits on the result backend's pub/sub."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._redis = redis.Redis.from_url(settings.backend_url)
        self._registry = RegistryView(redis.Redis.from_url(settings.broker_url), settings)
        self.listener = ResultListener(settings.backend_url, app.backend.get_key_for_task)
        self._lock = threading.Lock()
        self._futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        self._sender = app.amqp.send_task_message
        self._calls: dict[str, PreparedCall] = {}
        # Async batches publish from their own threads: never the event loop, and never
        # the default executor, where they would queue behind unrelated work.
        self._publisher = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="toolfleet-publish"
        )
        self._batches: dict[asyncio.AbstractEventLoop, _Batch] = {}

    # -- registry -------------------------------------------------------------------------

    def served_tools(self) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves now (cached for a second)."""
        return self._registry.tools()

    def registry(self) -> RegistryView:
        """The registry view this dispatcher routes with."""
        return self._registry

    # -- publishing ---------------------------------------------------------------------

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Watch and publish every call this process has not watched yet.

        Raises:
            DispatchError: the broker refused the messages.
        """
        fresh = self._watch(calls, on_state)
        if fresh:
            self._publish_or_forget(fresh)

    def _watch(
        self, calls: Sequence[PreparedCall], on_state: StateCallback | None
    ) -> list[PreparedCall]:
        """Start watching the calls not watched yet; those are the ones to publish."""
        with self._lock:
            fresh = [c for c in calls if c.task_id not in self._futures]
            if fresh:
                futures = self.listener.watch([c.task_id for c in fresh], on_state)
                self._futures.update(futures)
                self._calls.update((c.task_id, c) for c in fresh)
        return fresh

    def _publish_or_forget(self, calls: Sequence[PreparedCall]) -> None:
        try:
            self._publish(calls)
        except Exception as exc:
            for call in calls:
                self._forget(call.task_id)
            raise DispatchError(f"could not publish {len(calls)} tool call(s): {exc!r}") from exc

    def submitted(self, task_id: str) -> PreparedCall | None:
        """The call published under ``task_id`` that this process still waits on."""
        with self._lock:
            return self._calls.get(task_id)

    async def submit_async(self, call: PreparedCall, on_state: StateCallback | None = None) -> None:
        """Publish ``call`` together with every call submitted in the same loop turns.

        The Send tasks of one superstep start in the same turn of the event loop; waiting
        two turns before publishing lets a whole fan-out go out as one batch.

        Raises:
            DispatchError: the broker refused the messages.
        """
        if not self._watch([call], on_state):
            return
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if batch is None:
            batch = _Batch(loop.create_future())
            self._batches[loop] = batch
            loop.call_soon(self._flush_batch, loop, batch, 2)
        batch.calls.append(call)
        await asyncio.shield(batch.done)

    def _flush_batch(self, loop: asyncio.AbstractEventLoop, batch: _Batch, turns: int) -> None:
        if turns > 0:
            loop.call_soon(self._flush_batch, loop, batch, turns - 1)
            return
        if self._batches.get(loop) is batch:
            del self._batches[loop]
        published = loop.run_in_executor(self._publisher, self._publish_or_forget, batch.calls)

        def _done(fut: asyncio.Future[None]) -> None:
            if batch.done.done():
                return
            if fut.exception() is not None:
                batch.done.set_exception(fut.exception())  # type: ignore[arg-type]
            else:
                batch.done.set_result(None)

        published.add_done_callback(_done)

    def _publish(self, calls: Sequence[PreparedCall]) -> None:
        prefix = self.settings.key_prefix
        markers = [call_marker_key(prefix, c.task_id) for c in calls]
        with self._redis.pipeline(transaction=False) as pipe:
            for marker in markers:
                pipe.set(marker, "pending", nx=True, ex=PENDING_MARKER_TTL)
            claimed = pipe.execute()
        to_send = [c for c, ok in zip(calls, claimed, strict=True) if ok]
        attached = len(calls) - len(to_send)
        if attached:
            log.info("%d call(s) already dispatched; attaching to their results", attached)
        if not to_send:
            return
        amqp = self.app.amqp
        with self.app.producer_or_acquire() as producer, producer.batch():
            for call in to_send:
                name = task_name(call.tool)
                options = amqp.router.route(
                    {"queue": call.queue} if call.queue else {}, name, (), {}
                )
                message = amqp.create_task_message(
                    call.task_id,
                    name,
                    (call.request().model_dump(mode="json"),),
                    {},
                    reply_to=self.app.thread_oid,
                    argsrepr=_argsrepr(call),
                    kwargsrepr="{}",
                )
                self._sender(producer, name, message, **options)
        with self._redis.pipeline(transaction=False) as pipe:
            for call in to_send:
                pipe.set(
                    call_marker_key(prefix, call.task_id), "sent", ex=self.settings.result_expires
                )
            pipe.execute()

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
        """Block until the call's result is in.

        Raises:
            ResultTimeout: no result within ``timeout`` seconds.
        """
        future = self._future(call)
        try:
            meta = future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            raise ResultTimeout(f"no result for {call.tool} call {call.call_id}") from exc
        finally:
            self._forget(call.task_id)
        return result_from_meta(meta, call.tool, call.spec)

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await the call's result on the running event loop.

        Raises:
            ResultTimeout: no result within ``timeout`` seconds.
        """
        future = self._future(call)
        try:
            meta = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError as exc:
            raise ResultTimeout(f"no result for {call.tool} call {call.call_id}") from exc
        finally:
            self._forget(call.task_id)
        return result_from_meta(meta, call.tool, call.spec)

    def _forget(self, task_id: str) -> None:
        with self._lock:
            self._calls.pop(task_id, None)
            if self._futures.pop(task_id, None) is None:
                return
        self.listener.release(task_id)

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Revoke the calls (terminating them on prefork workers) and stop waiting."""
        ids = [c.task_id for c in calls]
        if not ids:
            return
        try:
            self.app.control.revoke(ids, terminate=terminate, signal="SIGTERM")
        except Exception as exc:  # revocation is best effort; the run is ending anyway
            log.warning("could not revoke %d call(s): %r", len(ids), exc)
        for task_id in ids:
            self._forget(task_id)

    def in_flight(self) -> int:
        """Calls this process is waiting on."""
        with self._lock:
            return len(self._futures)

    def close(self) -> None:
        """Stop the result listener and drop connections."""
        self.listener.close()
        self._publisher.shutdown(wait=False)
        self._redis.close()


def _argsrepr(call: PreparedCall) -> str:
    # Flower and logs show which call this is, never the arguments (secrets, size).
    return f"({call.tool} call={call.call_id} thread={call.thread_id or '-'})"
