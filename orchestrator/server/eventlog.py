"""Each run's stream parts in a Redis stream, readable from every replica.

The replica executing a run appends every stream part to ``run-events:<id>`` (one
``XADD``), then an end marker. Whoever streams or joins the run (the same replica or
another one behind the load balancer) reads that stream: one code path, and a stream
survives a client reconnecting to a different replica. The entry ids double as SSE event
ids, so a client that reconnects with ``Last-Event-ID`` resumes where it left off.

A replica reads all the runs its clients follow with one blocking ``XREAD`` over their
streams (not a connection per client); a per-replica *wake* stream in the same ``XREAD``
lets a new follower join without waiting for the block to time out. One stream that
Redis refuses to read (a key of the wrong type, say) must not starve the others: when
the shared read fails with a reply error, each stream is read alone once, and only the
followers of the failing ones are dropped (their clients see the stream end).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from orchestrator.backoff import Backoff, raise_if_cancelled, retried
from orchestrator.server.encoding import loads
from orchestrator.server.keys import Keys
from orchestrator.server.runlease import LEASE_SELF_STOP, LEASE_TTL_MS

log = logging.getLogger("toolfleet.server")

END = "__end__"
"""Event name of the marker after a run's last stream part (its data: the run status)."""

MAX_EVENTS = 10_000
"""Entries kept per run (approximately): a very long run's earliest parts are trimmed."""

APPEND_RETRY = LEASE_SELF_STOP * LEASE_TTL_MS / 1000
"""Seconds an append tries again after the link to Redis is lost: as long as a run goes on
without renewing its lease, so a blip shorter than that neither fails a run nor hands it
on."""

BLOCK_MS = 5_000
"""Longest blocking read of the relay (its connection's socket timeout is longer)."""

_BACKLOG = 10_000
"""Entries buffered for one follower; a follower that falls this far behind is dropped
(its client reconnects with ``Last-Event-ID`` and catches up from Redis)."""


class Entry(NamedTuple):
    """One stream part: its id (also the SSE event id), event name and JSON data."""

    id: str
    event: str
    data: bytes


_ENTRY_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?", re.ASCII)
_ID_MAX = 2**64 - 1


def parse_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``"1700000000000-0"`` or ``"0"``) as a comparable pair.

    Only what Redis accepts as a stream id passes: ASCII digits, each part below 2**64
    (``int()`` alone would also take ``"5_000"`` and non-ASCII digits, which Redis
    refuses).

    Raises:
        ValueError: not an entry id.
    """
    match = _ENTRY_ID.fullmatch(entry_id)
    if match is None:
        raise ValueError(f"not a stream entry id: {entry_id[:40]!r}")
    ms, seq = int(match[1]), int(match[2] or 0)
    if ms > _ID_MAX or seq > _ID_MAX:
        raise ValueError(f"stream entry id out of range: {entry_id[:40]!r}")
    return ms, seq


def canonical_id(entry_id: str) -> str:
    """``entry_id`` in the ``<ms>-<seq>`` form Redis answers with.

    Raises:
        ValueError: not an entry id.
    """
    ms, seq = parse_id(entry_id)
    return f"{ms}-{seq}"


class FollowerDropped(Exception):
    """Raised to a follower the relay stopped feeding (it fell behind, or its stream
    cannot be read); its client reconnects, or polls the run's record."""


class EventLog:
    """Appends a run's stream parts (the replica executing it).

    Args:
        client: A ``redis.asyncio`` client (bytes responses).
        keys: Key names of the deployment.
        ttl: Seconds the log is kept after its last entry.
    """

    def __init__(
        self, client: aioredis.Redis, keys: Keys, ttl: int, retry_for: float = APPEND_RETRY
    ) -> None:
        self._r: Any = client  # redis-py's stubs type replies loosely
        self._keys = keys
        self._ttl = ttl
        self._retry_for = retry_for
        self._writer = uuid.uuid4().hex[:12]
        self._written = itertools.count()

    async def append(self, run_id: str, event: str, data: bytes) -> None:
        """Append one stream part, once, though the link to Redis is lost for up to
        ``retry_for`` seconds (a try after a lost one first looks whether that one's
        entry went in: each entry carries this log's writer id and a count)."""
        key = self._keys.events(run_id)
        mark = f"{self._writer}:{next(self._written)}".encode()

        async def write(tries: int) -> None:
            if tries:
                newest = await self._r.xrevrange(key, count=1)
                if newest and newest[0][1].get(b"n") == mark:
                    await self._r.expire(key, self._ttl)
                    return
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.xadd(
                    key, {"e": event, "d": data, "n": mark}, maxlen=MAX_EVENTS, approximate=True
                )
                pipe.expire(key, self._ttl)
                await pipe.execute()

        await retried(write, within=self._retry_for, what=f"the stream of run {run_id}")

    async def end(self, run_id: str, status: str) -> None:
        """Mark the end of the run's stream parts."""
        await self.append(run_id, END, status.encode())

    async def last(self, run_id: str) -> Entry | None:
        """The newest entry of the run's log."""
        newest = await self._r.xrevrange(self._keys.events(run_id), count=1)
        return _entry(*newest[0]) if newest else None

    async def last_of(self, run_id: str, event: str) -> Any:
        """The data (parsed) of the newest entry named ``event``, or ``None``."""
        key, upper = self._keys.events(run_id), "+"
        while True:
            page = await self._r.xrevrange(key, max=upper, count=100)
            for entry in (_entry(*item) for item in page):
                if entry.event == event:
                    return loads(entry.data)
            if len(page) < 100:
                return None
            upper = "(" + _entry(*page[-1]).id


def _entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
    eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return Entry(eid, fields.get(b"e", b"").decode(), fields.get(b"d", b""))


@dataclass(eq=False)
class Follower:
    """One reader of one run's log, fed by the relay."""

    run_id: str
    position: str
    queue: asyncio.Queue[Entry] = field(default_factory=asyncio.Queue)
    dropped: str | None = None
    """Why the relay stopped feeding this follower, once it has."""
    _woken: asyncio.Event = field(default_factory=asyncio.Event)

    async def next(self, timeout: float | None = None) -> Entry | None:
        """The next entry; ``None`` after ``timeout`` seconds without one.

        Raises:
            FollowerDropped: the relay stopped feeding this follower.
        """
        if self.dropped is not None and self.queue.empty():
            raise FollowerDropped(f"reader of run {self.run_id}: {self.dropped}")
        try:
            return await asyncio.wait_for(self._get(), timeout)
        except TimeoutError:
            return None

    async def _get(self) -> Entry:
        while self.queue.empty():
            if self.dropped is not None:
                raise FollowerDropped(f"reader of run {self.run_id}: {self.dropped}")
            self._woken.clear()
            await self._woken.wait()
        return self.queue.get_nowait()

    def put(self, entry: Entry) -> None:
        """Hand the follower one entry (the relay)."""
        self.queue.put_nowait(entry)
        self.position = entry.id
        self._woken.set()

    def drop(self, reason: str) -> None:
        """Stop feeding the follower; its reader gets :class:`FollowerDropped`."""
        self.dropped = reason
        self._woken.set()


class EventRelay:
    """Feeds every follower on this replica from one blocking ``XREAD``.

    Args:
        client: A ``redis.asyncio`` client (bytes responses) for the blocking read alone;
            its socket timeout must exceed :data:`BLOCK_MS`.
        waker: A client (any responses) for the wake writes, shared with other users.
        keys: Key names of the deployment.
        replica_id: This replica's id (names its wake stream).
    """

    def __init__(
        self, client: aioredis.Redis, waker: aioredis.Redis, keys: Keys, replica_id: str
    ) -> None:
        self._r: Any = client
        self._waker: Any = waker
        self._keys = keys
        self._wake_key = keys.wake(replica_id)
        self._wake_position = "0-0"
        self._followers: dict[str, set[Follower]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake_sent = False

    async def start(self) -> None:
        """Start the reader task."""
        self._task = asyncio.create_task(self._read_forever(), name="toolfleet-event-relay")

    async def close(self) -> None:
        """Stop the reader task and drop the wake stream."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(RedisError, OSError):
            await self._waker.delete(self._wake_key)

    @property
    def followers(self) -> int:
        """Followers the relay feeds now."""
        return sum(len(f) for f in self._followers.values())

    @contextlib.asynccontextmanager
    async def follow(self, run_id: str, after: str = "0-0") -> AsyncIterator[Follower]:
        """Follow the run's log from just after entry ``after`` (``"0-0"``: the start).

        Raises:
            ValueError: ``after`` is not a stream entry id.
        """
        follower = Follower(run_id, canonical_id(after))
        self._followers.setdefault(run_id, set()).add(follower)
        try:
            await self._wake()
            yield follower
        finally:
            followers = self._followers.get(run_id)
            if followers is not None:
                followers.discard(follower)
                if not followers:
                    del self._followers[run_id]

    async def _wake(self) -> None:
        # One wake a read: the reader takes every follower added since it last looked.
        if self._wake_sent:
            return
        self._wake_sent = True
        try:
            async with self._waker.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {"w": uuid.uuid4().hex[:8]}, maxlen=16, approximate=False)
                pipe.expire(self._wake_key, 86_400)
                await pipe.execute()
        except BaseException:
            self._wake_sent = False
            raise

    async def _read_forever(self) -> None:
        backoff = Backoff()
        while True:
            self._wake_sent = False  # before looking: a follower added after it wakes again
            streams: dict[str, str] = {self._wake_key: self._wake_position}
            by_key: dict[bytes, str] = {}
            for run_id, followers in list(self._followers.items()):
                if not followers:
                    continue
                key = self._keys.events(run_id)
                streams[key] = min((f.position for f in followers), key=parse_id)
                by_key[key.encode()] = run_id
            try:
                result = await self._r.xread(streams, block=BLOCK_MS, count=500)
            except ResponseError:
                # Redis refused one of the streams: find it, drop its followers, go on.
                try:
                    if not await self._drop_unreadable(streams, by_key):
                        await asyncio.sleep(backoff.next())  # none failed alone: do not spin
                except (RedisError, OSError) as exc:
                    raise_if_cancelled(exc)
                    log.warning("event relay lost Redis (%r); retrying", exc)
                    await asyncio.sleep(backoff.next())
                continue
            except (RedisError, OSError) as exc:
                raise_if_cancelled(exc)
                log.warning("event relay lost Redis (%r); retrying", exc)
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            for key, entries in result or []:
                raw_key = key if isinstance(key, bytes) else key.encode()
                if raw_key == self._wake_key.encode():
                    self._wake_position = _entry(*entries[-1]).id
                    continue
                followed = by_key.get(raw_key)
                if followed is not None:
                    start = parse_id(streams[raw_key.decode()])
                    self._deliver(followed, start, [_entry(*e) for e in entries])

    async def _drop_unreadable(self, streams: dict[str, str], by_key: dict[bytes, str]) -> int:
        """Read each stream alone; drop the followers of those Redis refuses. Returns
        how many streams failed."""
        failed = 0
        for key, position in streams.items():
            try:
                await self._r.xread({key: position}, count=1)
            except ResponseError as exc:
                failed += 1
                run_id = by_key.get(key.encode())
                if run_id is None:  # the wake stream itself: start it afresh
                    self._wake_position = "0-0"
                    await self._waker.delete(self._wake_key)
                    continue
                log.warning("event log of run %s cannot be read (%s)", run_id, exc)
                for follower in self._followers.pop(run_id, set()):
                    follower.drop("its event log cannot be read")
        return failed

    def _deliver(self, run_id: str, start: tuple[int, int], entries: list[Entry]) -> None:
        """Hand ``entries`` (read after ``start``) to the followers they continue."""
        for follower in list(self._followers.get(run_id, ())):
            position = parse_id(follower.position)
            if position < start:
                # Joined during this read: it needs earlier entries first, and the next
                # read (from the lowest position) brings them.
                continue
            for entry in entries:
                if parse_id(entry.id) <= position:
                    continue
                if follower.queue.qsize() >= _BACKLOG:
                    follower.drop("it fell behind")
                    self._followers[run_id].discard(follower)
                    break
                follower.put(entry)
