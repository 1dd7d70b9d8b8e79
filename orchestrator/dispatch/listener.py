"""One result listener per dispatcher: the reply channel's pub/sub, turned into futures.

Every call this process publishes names its *reply channel* as ``reply_to``; the
workers store each state under Celery's ``celery-task-meta-<id>`` key and publish it
once, on that channel (:mod:`tool_workers.celery_ext.backend`). The listener holds one
pub/sub connection in a background thread (an asyncio loop with ``redis.asyncio``),
subscribed to the reply channel alone, and resolves a
:class:`concurrent.futures.Future` per watched call: a sync caller blocks on it, an
async caller awaits ``asyncio.wrap_future`` of it, so no thread or executor slot is held
per call.

The key is read instead of waiting for the channel when that is the only way to hear:
for a call published by someone else (attached to, or already answered:
:meth:`ResultListener.read_now`), after a reconnect (states published while the
connection was down), and, every :data:`SWEEP_INTERVAL`, for every call still pending.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.backoff import raise_if_cancelled, subscribe_forever
from orchestrator.dispatch.late import LATE_OPENING
from orchestrator.dispatch.link import LinkHealth
from orchestrator.dispatch.watch import StateCallback, WatchTable

log = logging.getLogger("toolfleet.results")

SWEEP_INTERVAL = 2.0
"""Seconds between re-reads of pending results (covers messages missed during outages)."""


class ResultListener:
    """Watches call results on a Redis result backend; thread-safe, one per dispatcher.

    Args:
        connect: Makes the listener's ``redis.asyncio`` client of the result backend (on
            the listener's own loop).
        key_for_task: Maps a task id to its result key (Celery's naming).
        reply_channel: This process's reply channel.
    """

    def __init__(
        self,
        connect: Callable[[], aioredis.Redis],
        key_for_task: Callable[[str], str],
        reply_channel: str,
    ) -> None:
        self.reply_channel = reply_channel.encode()
        self._ready = threading.Event()
        self._connect = connect
        self._key_for_task = key_for_task
        self._table = WatchTable()
        self._lock = self._table.lock
        self._watches = self._table.watches
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._closed = False
        self._stopping = threading.Event()
        self._main_task: asyncio.Task[None] | None = None
        self._to_read: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        self.subscribed: set[bytes] = set()
        """Channels the pub/sub connection is subscribed to now (for leak checks)."""
        self.link = LinkHealth()
        """How the listener's round trips to Redis go (named by a deadline's error)."""
        self.on_late: Callable[[bytes], None] | None = None
        """Gets each late notice (a result that came after its call was answered as
        lost, :mod:`.late`), raw, on the listener's thread."""

    # -- public API, callable from any thread ------------------------------------------

    def watch(
        self, task_ids: Iterable[str], on_state: StateCallback | None = None
    ) -> dict[str, concurrent.futures.Future[dict[str, Any]]]:
        """Futures resolving to each call's ready Celery meta (:meth:`WatchTable.watch`;
        ``on_state`` is called from the listener thread)."""
        self._ensure_started()
        return self._table.watch(task_ids, on_state)

    def read_now(self, task_ids: Iterable[str]) -> None:
        """Read these calls' results now (they may be stored already, or be reported on
        another process's channel)."""
        ids = list(task_ids)
        loop = self._loop
        if not ids or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed while shutting down
            loop.call_soon_threadsafe(self._read_soon, ids)

    @property
    def ready(self) -> bool:
        """Whether the reply channel is subscribed now."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Block until the reply channel is subscribed (nothing published to it is lost)."""
        self._ensure_started()
        return self._ready.wait(timeout)

    def release(self, task_id: str) -> None:
        """Drop one watch of ``task_id``."""
        self._table.release(task_id)

    def pending(self) -> int:
        """How many calls are watched now."""
        return self._table.pending()

    def last_activity(self, task_id: str) -> float | None:
        """When (monotonic) a started call last showed life; ``None`` if not started."""
        return self._table.last_activity(task_id)

    def close(self) -> None:
        """Stop the listener thread; pending futures are cancelled."""
        with self._lock:
            self._closed = True
        self._table.close()
        self._stopping.set()
        if self._loop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._cancel_main)
            self._thread.join(timeout=5)

    def _cancel_main(self) -> None:
        if self._main_task is not None:
            self._main_task.cancel()

    # -- the listener thread ------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the listener thread runs (its first watch starts it)."""
        return self._started.is_set()

    def start(self) -> None:
        """Start the listener thread now and wait for it to run."""
        self._ensure_started()

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("result listener is closed")
        if self._started.is_set():
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("result listener is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="toolfleet-results", daemon=True
                )
                self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._main_task = loop.create_task(self._main())
        self._started.set()
        try:
            loop.run_until_complete(asyncio.gather(self._main_task, return_exceptions=True))
        finally:
            loop.close()

    async def _main(self) -> None:
        client = self._connect()
        self._client = client
        sweeper = asyncio.create_task(self._sweep_forever())
        try:
            await subscribe_forever(
                client,
                self.reply_channel,
                self._on_message,
                what="result pub/sub connection",
                on_subscribed=self._on_subscribed,
                on_lost=self._on_lost,
                stopping=self._stopping.is_set,
            )
        finally:
            # Ended, not just cancelled, before the client closes: a read or sweep still
            # connecting would otherwise leave its connection open as the loop closes.
            self.subscribed.clear()
            tasks = [t for t in (sweeper, self._reader) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()

    def _on_message(self, data: bytes) -> None:
        if data.startswith(LATE_OPENING):
            if self.on_late is not None:
                self.on_late(data)
            return
        self._table.deliver_reply(data)

    def _on_subscribed(self) -> None:
        self.link.ok()
        self.subscribed.add(self.reply_channel)
        self._ready.set()
        # After a reconnect: states published while the connection was down.
        with self._lock:
            pending = list(self._watches)
        self._read_soon(pending)

    def _on_lost(self, exc: BaseException) -> None:
        if isinstance(exc, (RedisError, OSError)):
            self.link.failed(exc)
        self.subscribed.clear()
        self._ready.clear()

    def _read_soon(self, task_ids: list[str]) -> None:
        """Read these keys in one MGET with whatever else is due this turn (on the loop)."""
        self._to_read.extend(task_ids)
        if self._to_read and (self._reader is None or self._reader.done()):
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        await asyncio.sleep(0)  # let the rest of the burst join
        while self._to_read:
            ids, self._to_read = self._to_read, []
            await self._read_keys(ids, "catch-up")

    async def _read_keys(self, task_ids: list[str], why: str) -> None:
        with self._lock:
            wanted = [t for t in dict.fromkeys(task_ids) if t in self._watches]
        if not wanted:
            return
        tried = time.monotonic()
        try:
            values = await self._client.mget([self._key_for_task(t) for t in wanted])
        except (RedisError, OSError) as exc:  # the sweep reads them again
            raise_if_cancelled(exc)
            log.warning("result %s read failed (%r)", why, exc)
            self.link.failed(exc, tried)
            return
        self.link.ok()
        for task_id, raw in zip(wanted, values, strict=True):
            self._table.deliver(task_id, raw)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            horizon = time.monotonic() - SWEEP_INTERVAL
            with self._lock:
                due = [t for t, w in self._watches.items() if w.since < horizon]
            if due:
                await self._read_keys(due, "sweep")
