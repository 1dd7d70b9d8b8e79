"""The publications of one dispatcher: how its calls reach the broker, async calls batched
per loop, and the calls whose publication failed.

The Send tasks of one superstep start in the same turn of the event loop; a call waits
two turns before its batch is published, so a whole fan-out goes out as one batch. A
batch is published on the loop itself, awaited, when nothing in that blocks: its
messages go out in one script (:meth:`Publisher.publishes_on_loop`) through the loop's
own Redis client (:mod:`orchestrator.dispatch.loop_redis`), so the call's way out takes
no thread hop. Any other batch, and every sync caller's, is published blocking: an
async caller's from threads of this object's own (never the event loop, never the
default executor).

A call whose publication failed is not on the queue because of this process, so a
cancellation has nothing to revoke for it. That matters when LangGraph cancels the rest
of a step after one call's publication failed: a revocation recorded for the others
would answer them "cancelled" when the run is resumed, instead of running them. A call
cancelled while its batch is still being published is judged once the publication ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.driver_info import DriverInfo

from orchestrator.calls import PreparedCall
from orchestrator.dispatch.listener import ResultListener
from orchestrator.dispatch.loop_redis import LoopClients
from orchestrator.dispatch.publish import Publisher
from orchestrator.dispatch.timings import CallTimings
from tool_workers.contract.connections import async_redis_client
from tool_workers.contract.errors import DispatchError
from tool_workers.contract.settings import Settings


@dataclass
class _Batch:
    done: asyncio.Future[None]
    calls: list[PreparedCall] = field(default_factory=list)


class Publications:
    """Publishes a dispatcher's calls, batches async ones, remembers which failed."""

    def __init__(
        self,
        publisher: Publisher,
        listener: ResultListener,
        settings: Settings,
        forget: Callable[[str], None],
    ) -> None:
        """
        Args:
            publisher: Claims and publishes the calls.
            listener: Gets their results (it must be subscribed before they go out).
            settings: Name the Redis server of the async publications' clients.
            forget: Stops the dispatcher waiting on a call whose publication failed.
        """
        self._publisher = publisher
        self._listener = listener
        self._settings = settings
        self._forget = forget
        self.timings: CallTimings | None = None
        """The dispatcher's call timings, if it keeps them."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="toolfleet-publish"
        )
        # redis-py reads its own version from the package metadata (a file) for each new
        # connection: read once, by the first blocking publication, which always comes
        # before one on a loop (see Publisher.publishes_on_loop).
        self._driver_info: DriverInfo | None = None
        self._loop_clients = LoopClients(self._loop_client)
        self._lock = threading.Lock()
        self._batches: dict[asyncio.AbstractEventLoop, _Batch] = {}
        self._in_flight: dict[str, concurrent.futures.Future[None]] = {}
        """Calls whose batch is being published now, by task id: its publication."""
        self._failed: dict[str, float] = {}
        """Calls whose publication failed (when)."""

    def publish(self, calls: Sequence[PreparedCall]) -> None:
        """Publish the calls now, blocking.

        Raises:
            DispatchError: the broker refused the messages.
        """
        try:
            if self._driver_info is None:
                self._driver_info = DriverInfo()
            if not self._listener.wait_ready():
                raise DispatchError("the result listener could not subscribe its reply channel")
            if self.timings is not None:
                self.timings.publishing(calls)
            self._published(self._publisher.publish(calls))
        except Exception as exc:
            raise self._publication_failed(calls, exc) from exc

    async def join(self, call: PreparedCall) -> None:
        """Publish ``call`` with the calls joining in the same loop turns.

        Raises:
            DispatchError: the broker refused the messages.
        """
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if batch is None:
            batch = _Batch(loop.create_future())
            self._batches[loop] = batch
            loop.call_soon(self._flush, loop, batch, 2)
        batch.calls.append(call)
        await asyncio.shield(batch.done)

    def _flush(self, loop: asyncio.AbstractEventLoop, batch: _Batch, turns: int) -> None:
        if turns > 0:
            loop.call_soon(self._flush, loop, batch, turns - 1)
            return
        if self._batches.get(loop) is batch:
            del self._batches[loop]
        publication: concurrent.futures.Future[None]
        if self._publishes_on_loop(batch.calls):
            publication = concurrent.futures.Future()
            task = loop.create_task(self._publish_on_loop(batch.calls))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            # Mirrored where other threads can wait on it (a cancellation's revocable()).
            task.add_done_callback(functools.partial(_copy_outcome, to=publication))
            task.add_done_callback(functools.partial(_copy_outcome, to=batch.done))
        else:
            publication = self._pool.submit(self.publish, batch.calls)
            asyncio.wrap_future(publication, loop=loop).add_done_callback(
                functools.partial(_copy_outcome, to=batch.done)
            )
        with self._lock:
            self._in_flight.update((c.task_id, publication) for c in batch.calls)
        publication.add_done_callback(functools.partial(self._ended, batch.calls))

    def _publishes_on_loop(self, calls: Sequence[PreparedCall]) -> bool:
        return (
            self._driver_info is not None
            and self._listener.ready
            and self._publisher.publishes_on_loop(calls)
        )

    async def _publish_on_loop(self, calls: Sequence[PreparedCall]) -> None:
        try:
            if self.timings is not None:
                self.timings.publishing(calls)
            client = await self._loop_clients.get()
            attached = await self._publisher.publish_async(calls, client)
        except Exception as exc:
            raise self._publication_failed(calls, exc) from exc
        if attached is None:  # another thread was building messages: not worth waiting for
            await asyncio.wrap_future(self._pool.submit(self.publish, calls))
        else:
            self._published(attached)

    def _loop_client(self) -> aioredis.Redis:
        return async_redis_client(
            self._settings.backend_url, self._settings, driver_info=self._driver_info
        )

    def _published(self, attached: Sequence[PreparedCall]) -> None:
        if attached:
            # Published by someone else, with their reply channel: watch these on the
            # calls' own channels.
            self._listener.subscribe([c.task_id for c in attached])

    def _publication_failed(self, calls: Sequence[PreparedCall], exc: Exception) -> DispatchError:
        """Stop waiting on calls whose publication failed; the error to raise."""
        for call in calls:
            self._forget(call.task_id)
        self.failed(calls)
        if isinstance(exc, DispatchError):
            return exc
        return DispatchError(f"could not publish {len(calls)} tool call(s): {exc!r}")

    def _ended(self, calls: Sequence[PreparedCall], publication: object) -> None:
        with self._lock:
            for call in calls:
                if self._in_flight.get(call.task_id) is publication:
                    del self._in_flight[call.task_id]

    def failed(self, calls: Iterable[PreparedCall]) -> None:
        """Record that the publication of ``calls`` failed."""
        now = time.monotonic()
        with self._lock:
            self._failed.update((c.task_id, now) for c in calls)

    def publishing_again(self, task_ids: Iterable[str]) -> None:
        """The calls are being published again (a resume): revocable again."""
        with self._lock:
            for task_id in task_ids:
                self._failed.pop(task_id, None)

    def revocable(self, task_ids: Sequence[str]) -> list[str]:
        """The calls a cancellation must revoke: all but those whose publication failed,
        once the publications in flight for any of them have ended (blocks until then)."""
        with self._lock:
            in_flight = {self._in_flight[t] for t in task_ids if t in self._in_flight}
        concurrent.futures.wait(in_flight)
        with self._lock:
            return [t for t in task_ids if t not in self._failed]

    def forget_older_than(self, horizon: float) -> None:
        """Forget failures recorded before ``horizon`` (monotonic seconds)."""
        with self._lock:
            for task_id in [t for t, at in self._failed.items() if at < horizon]:
                del self._failed[task_id]

    def shutdown(self) -> None:
        """Stop the publishing threads (a publication in progress finishes) and close
        the loops' Redis clients."""
        self._pool.shutdown(wait=False)
        self._loop_clients.close()


def _copy_outcome(
    publication: asyncio.Future[None],
    *,
    to: asyncio.Future[None] | concurrent.futures.Future[None],
) -> None:
    """Give ``to`` the outcome of a finished publication (unless it has one already)."""
    if to.done():
        return
    if publication.cancelled():
        to.cancel()
    elif (exc := publication.exception()) is not None:
        to.set_exception(exc)
    else:
        to.set_result(None)
