"""One result listener per process: the result backend's pub/sub, turned into futures.

Celery's Redis backend stores a task's state under ``celery-task-meta-<id>`` and
publishes it on a channel of the same name. The listener holds one pub/sub
connection in a background thread (an asyncio loop with ``redis.asyncio``) and
resolves a :class:`concurrent.futures.Future` per watched task; sync callers block on
the future, async callers await ``asyncio.wrap_future`` of it, so no caller thread or
executor slot is held per call.

Calls this process publishes name its *reply channel* (subscribed once) as their
``reply_to``: the workers publish every state and progress batch of those calls there,
so no call needs a subscription of its own. A call published by another process (this
one attached to it) is watched on its own channel; once that subscription is confirmed
the listener reads the key once (a result stored before it is found there). A sweep
re-reads the keys of calls still pending every few seconds, so a result published while
the pub/sub connection was down (a Redis restart) is still collected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.driver_info import DriverInfo
from redis.exceptions import RedisError

from orchestrator.dispatch.watch import StateCallback, Watch, WatchTable
from tool_workers.contract import names as protocol

log = logging.getLogger("toolfleet.results")

IDLE_CHANNEL = protocol.IDLE_CHANNEL.encode()
"""Subscribed when there is no reply channel, so the pub/sub connection always exists."""

SWEEP_INTERVAL = 2.0
"""Seconds between re-reads of pending results (covers messages missed during outages)."""


class ResultListener:
    """Watches task results on a Redis result backend; thread-safe, one per process."""

    def __init__(
        self,
        url: str,
        key_for_task: Callable[[str], bytes],
        connection_kwargs: dict[str, Any] | None = None,
        reply_channel: str | None = None,
    ) -> None:
        """
        Args:
            url: Redis URL of the result backend.
            key_for_task: Maps a task id to its result key (Celery's
                ``backend.get_key_for_task``), which is also its pub/sub channel.
            connection_kwargs: More ``redis.asyncio`` options (TLS: see
                :func:`tool_workers.contract.connections.redis_connection_kwargs`).
            reply_channel: This process's reply channel: calls published with it as
                ``reply_to`` report every state there, so they need no channel of their
                own. ``None``: every call is watched on its own channel.
        """
        self.reply_channel = reply_channel.encode() if reply_channel else None
        self._reply_ready = threading.Event()
        self._url = url
        self._connection_kwargs = connection_kwargs or {}
        self._key_for_task = key_for_task
        self._table = WatchTable()
        # The table's own objects, mutated in place (never rebound).
        self._lock = self._table.lock
        self._watches = self._table.watches
        self._by_channel = self._table.by_channel
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: asyncio.Queue[tuple[str, list[bytes]]] | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._closed = False
        self._stopping = threading.Event()
        self._main_task: asyncio.Task[None] | None = None
        self._catchup: list[bytes] = []
        self._catchup_task: asyncio.Task[None] | None = None
        self._driver_info: DriverInfo | None = None
        self.subscribed: set[bytes] = set()
        """Channels the pub/sub connection is subscribed to now (for leak checks)."""

    # -- public API, callable from any thread ------------------------------------------

    def watch(
        self,
        task_ids: Iterable[str],
        on_state: StateCallback | None = None,
        *,
        subscribe: bool = True,
    ) -> dict[str, concurrent.futures.Future[dict[str, Any]]]:
        """Futures resolving to each task's Celery meta once it is ready.

        Watching a task that is already watched shares its future. Call :meth:`release`
        once per watch when the result is no longer wanted.

        Args:
            task_ids: The tasks.
            on_state: Called on every state change (from the listener thread).
            subscribe: Subscribe to each task's own channel. Pass ``False`` for calls
                about to be published with :attr:`reply_channel` as their ``reply_to``
                (see :meth:`subscribe` for the ones that turn out to be published by
                someone else).
        """
        self._ensure_started()
        if not subscribe and self.reply_channel is None:
            subscribe = True
        futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        new: list[bytes] = []
        with self._lock:
            for task_id in task_ids:
                watch = self._watches.get(task_id)
                if watch is None:
                    channel = self._key_for_task(task_id)
                    watch = Watch(concurrent.futures.Future(), channel, own_channel=subscribe)
                    self._watches[task_id] = watch
                    self._by_channel[channel] = task_id
                    if subscribe:
                        new.append(channel)
                else:
                    watch.waiters += 1
                if on_state is not None:
                    watch.on_state.append(on_state)
                futures[task_id] = watch.future
        if new:
            self._send("subscribe", new)
        return futures

    def subscribe(self, task_ids: Iterable[str]) -> None:
        """Also watch these (already watched) tasks on their own channels."""
        channels: list[bytes] = []
        with self._lock:
            for task_id in task_ids:
                watch = self._watches.get(task_id)
                if watch is not None and not watch.own_channel:
                    watch.own_channel = True
                    channels.append(watch.channel)
        if channels:
            self._send("subscribe", channels)

    @property
    def ready(self) -> bool:
        """Whether the reply channel is subscribed now (see :meth:`wait_ready`)."""
        return self.reply_channel is None or self._reply_ready.is_set()

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Block until the reply channel is subscribed (nothing published to it is lost)."""
        self._ensure_started()
        return self.reply_channel is None or self._reply_ready.wait(timeout)

    def release(self, task_id: str) -> None:
        """Drop one watch of ``task_id``; the last one unsubscribes."""
        with self._lock:
            watch = self._watches.get(task_id)
            if watch is None:
                return
            watch.waiters -= 1
            if watch.waiters > 0:
                return
            del self._watches[task_id]
            self._by_channel.pop(watch.channel, None)
        if not watch.future.done():
            watch.future.cancel()
        if watch.own_channel:
            self._send("unsubscribe", [watch.channel])

    def pending(self) -> int:
        """How many task results are watched now."""
        with self._lock:
            return len(self._watches)

    def close(self) -> None:
        """Stop the listener thread; pending futures are cancelled."""
        with self._lock:
            self._closed = True
            watches = list(self._watches.values())
            self._watches.clear()
            self._by_channel.clear()
        for watch in watches:
            watch.future.cancel()
        self._stopping.set()
        if self._loop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._cancel_main)
            self._thread.join(timeout=5)

    def _cancel_main(self) -> None:
        if self._commands is not None:
            self._commands.put_nowait(("stop", []))
        if self._main_task is not None:
            self._main_task.cancel()

    # -- the listener thread ------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the listener thread runs (its first watch starts it)."""
        return self._started.is_set()

    def start(self) -> None:
        """Start the listener thread now and wait for it (an async caller does this off
        its event loop, before its first watch)."""
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

    def _send(self, command: str, channels: list[bytes]) -> None:
        loop, queue = self._loop, self._commands
        if loop is None or queue is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed while shutting down
            loop.call_soon_threadsafe(queue.put_nowait, (command, channels))

    def _run(self) -> None:
        # redis-py reads its own version from the package metadata (a file stat) for each
        # new connection: read once here, off the loop.
        self._driver_info = DriverInfo()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._commands = asyncio.Queue()
        self._main_task = loop.create_task(self._main())
        self._started.set()
        try:
            loop.run_until_complete(asyncio.gather(self._main_task, return_exceptions=True))
        finally:
            loop.close()

    async def _main(self) -> None:
        client = aioredis.from_url(
            self._url,
            health_check_interval=5,
            socket_keepalive=True,
            driver_info=self._driver_info,
            **self._connection_kwargs,
        )
        sweeper = asyncio.create_task(self._sweep_forever(client))
        backoff = 0.1
        try:
            while not self._stopping.is_set():
                try:
                    await self._listen(client)
                except (RedisError, OSError) as exc:
                    log.warning("result pub/sub connection lost (%r); reconnecting", exc)
                    self.subscribed.clear()
                    self._reply_ready.clear()
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                else:
                    backoff = 0.1
        finally:
            sweeper.cancel()
            await client.aclose()

    async def _listen(self, client: aioredis.Redis) -> None:
        assert self._commands is not None
        pubsub = client.pubsub()
        try:
            with self._lock:
                channels = [w.channel for w in self._watches.values() if w.own_channel]
            # The reply channel, or something to keep the connection when idle.
            await pubsub.subscribe(self.reply_channel or IDLE_CHANNEL, *channels)
            commands = asyncio.create_task(self._pump_commands(pubsub))
            try:
                # redis-py may turn a cancellation inside get_message into a timeout, so
                # the loop also checks the stop flag.
                while not self._stopping.is_set():
                    if commands.done():
                        commands.result()  # re-raise a connection error
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        await self._on_message(client, message)
            finally:
                commands.cancel()
                # redis-py can swallow the cancellation of a command in progress: wait a
                # little, never forever (the pump also stops on the stop flag).
                await asyncio.wait([commands], timeout=1.0)
        finally:
            aclose: Callable[[], Awaitable[None]] = pubsub.aclose  # redis-py: unannotated
            await aclose()

    async def _pump_commands(self, pubsub: Any) -> None:
        assert self._commands is not None
        while not self._stopping.is_set():
            command, channels = await self._commands.get()
            if command == "stop":
                return
            # Coalesce a burst (a fan-out) into one command of each kind.
            batch: dict[str, list[bytes]] = {"subscribe": [], "unsubscribe": []}
            batch[command].extend(channels)
            while not self._commands.empty():
                more_command, more = self._commands.get_nowait()
                if more_command == "stop":
                    return
                batch[more_command].extend(more)
            with self._lock:
                watched = set(self._by_channel)
            subscribe = [c for c in batch["subscribe"] if c in watched]
            unsubscribe = [c for c in batch["unsubscribe"] if c not in watched]
            if subscribe:
                await pubsub.subscribe(*subscribe)
            if unsubscribe:
                await pubsub.unsubscribe(*unsubscribe)

    async def _on_message(self, client: aioredis.Redis, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if kind == "subscribe" and channel == self.reply_channel:
            self.subscribed.add(channel)
            self._reply_ready.set()
            # After a reconnect: states published while the connection was down.
            with self._lock:
                pending = [w.channel for w in self._watches.values() if not w.own_channel]
            self._catchup.extend(pending)
            if pending and (self._catchup_task is None or self._catchup_task.done()):
                self._catchup_task = asyncio.create_task(self._read_catchup(client))
        elif kind == "subscribe":
            self.subscribed.add(channel)
            # Anything stored before the subscription took effect is in the key: read
            # those keys once, in one MGET for the whole burst of confirmations.
            self._catchup.append(channel)
            if self._catchup_task is None or self._catchup_task.done():
                self._catchup_task = asyncio.create_task(self._read_catchup(client))
        elif kind == "unsubscribe":
            self.subscribed.discard(channel)
        elif kind == "message" and channel == self.reply_channel:
            self._table.deliver_reply(message["data"])
        elif kind == "message":
            with self._lock:
                task_id = self._by_channel.get(channel)
            if task_id is not None:
                self._table.deliver(task_id, message["data"])

    async def _read_catchup(self, client: aioredis.Redis) -> None:
        await asyncio.sleep(0)  # let the rest of the burst's confirmations arrive
        while self._catchup:
            channels, self._catchup = self._catchup, []
            with self._lock:
                wanted = [(self._by_channel[c], c) for c in channels if c in self._by_channel]
            if not wanted:
                continue
            try:
                values = await client.mget([channel for _, channel in wanted])
            except (RedisError, OSError) as exc:  # the sweep collects these later
                log.warning("result catch-up read failed (%r)", exc)
                return
            for (task_id, _), raw in zip(wanted, values, strict=True):
                self._table.deliver(task_id, raw)

    async def _sweep_forever(self, client: aioredis.Redis) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            horizon = time.monotonic() - SWEEP_INTERVAL
            with self._lock:
                due = [(t, w.channel) for t, w in self._watches.items() if w.since < horizon]
            if not due:
                continue
            try:
                values = await client.mget([channel for _, channel in due])
            except (RedisError, OSError) as exc:
                log.warning("result sweep failed (%r); will retry", exc)
                continue
            for (task_id, _), raw in zip(due, values, strict=True):
                self._table.deliver(task_id, raw)

    def last_activity(self, task_id: str) -> float | None:
        """When (monotonic) a started call last showed life; ``None`` if not started."""
        return self._table.last_activity(task_id)
