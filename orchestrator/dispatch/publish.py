"""Publish tool calls onto the broker at most once each.

A call is claimed with ``SET <prefix>sent:<task id> pending:<token> NX`` before it is
published and the marker becomes ``sent`` once the broker has the message. Whoever fails
to claim a call attaches to it instead of publishing it again: another Send task of the
same fan-out, another orchestrator process, or this one resuming after a crash. A process
that dies between claiming and publishing leaves a ``pending`` marker that expires after
:data:`PENDING_MARKER_TTL`, after which a waiter claims and publishes the call itself.

Redis may act on a write whose reply never arrives (a link cut one way, a timeout just
after the server acted), so both writes around a publication are judged by what they
left in Redis, not by their reply:

* a claim retried after a lost reply finds markers holding its own token: those calls
  are its own, published now (not attached to, which would leave them unpublished
  until the markers expired);
* once the broker has the messages, the calls run, so a failure to mark them ``sent``
  does not fail the publication (the caller would stop waiting on calls that run): the
  marking is retried, and until it succeeds :meth:`Publisher.abandoned` knows the calls
  were published here.

When the markers live on the broker's own Redis (the result backend is the broker), the
claim and the publication are one script: each call's marker is set to ``sent`` and its
message pushed in the same round trip, atomically, so no ``pending`` marker is ever left
behind. The messages are built by kombu as usual (a producer batch that records the
commands instead of sending them: :mod:`orchestrator.dispatch.outbox`). Once a queue had
a message built, building the next ones is CPU only, so an async caller's publication
runs on its event loop: built there, and the script awaited through the loop's own
``redis.asyncio`` client (:meth:`Publisher.publish_async`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from celery import Celery

from orchestrator.calls import PreparedCall
from orchestrator.dispatch.outbox import Busy, Outbox
from tool_workers.celery_ext.transport import Captured
from tool_workers.contract.names import call_marker_key
from tool_workers.contract.settings import Settings

log = logging.getLogger("toolfleet.dispatch")

PENDING_MARKER_TTL = 60
"""Seconds a claim lives before its publication is confirmed."""

CLAIM_RETRY_SECONDS = 10.0
"""How long claiming retries while Redis is unreachable (a restart) before giving up."""

MARK_RETRY_SECONDS = 10.0
"""How long marking published calls ``sent`` retries before it is left to the waiters."""

_CLAIM_AND_PUSH = """
local k, a, out = 1, 3, {}
while k <= #KEYS do
    local claimed = redis.call('SET', KEYS[k], ARGV[2], 'NX', 'EX', ARGV[1])
    local n = tonumber(ARGV[a])
    k, a = k + 1, a + 1
    for _ = 1, n do
        if claimed then
            redis.call(ARGV[a], KEYS[k], ARGV[a + 1])
        end
        k, a = k + 1, a + 2
    end
    out[#out + 1] = claimed and 1 or 0
end
return out
"""
"""Per call: ``SET marker sent NX EX``; only if that claimed it, its publish commands.

KEYS: per call its marker, then the key of each of its commands. ARGV: the marker's
lifetime and value, then per call its number of commands and each command's name and
value. Returns 1 (claimed and published) or 0 (someone else's) per call."""


_EMPTY = Captured("")


class Publisher:
    """Claims and publishes calls through one Celery app and one Redis client."""

    def __init__(
        self, app: Celery, settings: Settings, client: redis.Redis, reply_to: str | None = None
    ) -> None:
        self.app = app
        self._client = client
        self._prefix = settings.key_prefix
        self._expires = settings.result_expires
        self.outbox = Outbox(app, settings, reply_to or app.thread_oid)
        self._lock = threading.Lock()
        self._unmarked: set[str] = set()
        """Task ids published here whose ``sent`` marker is not written yet."""
        scheme = settings.broker_url.partition("://")[0]
        self._one_trip = settings.backend_url == settings.broker_url and scheme in (
            "redis",
            "rediss",
        )
        self._claim_and_push: Any = None
        self._claim_and_push_async: Any = None

    def publish(self, calls: Sequence[PreparedCall]) -> list[PreparedCall]:
        """Publish every call nobody has claimed yet; returns the others (attached to).

        Raises:
            redis.RedisError, kombu's OperationalError: the broker refused the messages
                (the claims are released, so a later attempt can publish them).
        """
        if self._one_trip:
            published = self._publish_in_one_trip(calls)
            if published is not None:
                return published
        mine = self._claim(calls, f"pending:{uuid.uuid4().hex}")
        if len(mine) < len(calls):
            log.info("%d call(s) already dispatched; attaching", len(calls) - len(mine))
        claimed = {c.task_id for c in mine}
        attached = [c for c in calls if c.task_id not in claimed]
        if not mine:
            return attached
        try:
            self.outbox.send(mine)
        except Exception:
            self._release(mine)
            raise
        self._mark_sent(mine, MARK_RETRY_SECONDS)
        return attached

    def _publish_in_one_trip(self, calls: Sequence[PreparedCall]) -> list[PreparedCall] | None:
        """Claim and publish every call in one script; the attached ones, or ``None``
        when this broker's channel cannot hand its commands over."""
        script = self._script_args(calls)
        if script is None:
            return None  # nothing was sent: the claim-then-publish path sends them
        keys, args = script
        if self._claim_and_push is None:
            self._claim_and_push = self._client.register_script(_CLAIM_AND_PUSH)
        backoff = Backoff(CLAIM_RETRY_SECONDS)
        while True:
            try:
                claimed = self._claim_and_push(keys=keys, args=args)
                break
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Safe to run again: a call the lost attempt published is claimed now,
                # and is then attached to instead of published twice.
                time.sleep(backoff.next_or_raise(exc))
        return _attached(calls, claimed)

    def publishes_on_loop(self, calls: Sequence[PreparedCall]) -> bool:
        """Whether :meth:`publish_async` can publish ``calls`` without blocking: they go
        out in one script, and every queue they go to had a message built here before
        (kombu declared it then, with the round trips that takes)."""
        return self._one_trip and self.outbox.built_before(calls)

    async def publish_async(
        self, calls: Sequence[PreparedCall], client: aioredis.Redis
    ) -> list[PreparedCall] | None:
        """:meth:`publish` on the running event loop, through ``client`` (a client of
        that loop's), for calls :meth:`publishes_on_loop` accepts: the messages are
        built here (no I/O) and claimed and pushed in one script, awaited. ``None``,
        with nothing published, when another thread is building messages right now:
        publish those calls with :meth:`publish`, off the loop.

        Raises:
            redis.RedisError: Redis stayed unreachable for the retry window.
        """
        try:
            script = self._script_args(calls, wait=False)
        except Busy:
            return None
        if script is None:  # publishes_on_loop said yes: the transport changed under us
            raise RuntimeError("the broker's channel cannot hand its commands over")
        keys, args = script
        if self._claim_and_push_async is None:
            self._claim_and_push_async = client.register_script(_CLAIM_AND_PUSH)
        backoff = Backoff(CLAIM_RETRY_SECONDS)
        while True:
            try:
                claimed = await self._claim_and_push_async(keys=keys, args=args, client=client)
                break
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # as in publish()
                await asyncio.sleep(backoff.next_or_raise(exc))
        return _attached(calls, claimed)

    def _script_args(
        self, calls: Sequence[PreparedCall], *, wait: bool = True
    ) -> tuple[list[str], list[str | int | bytes]] | None:
        """The keys and arguments of the one-script publication of ``calls``; ``None``
        when this broker's channel cannot hand its commands over.

        Raises:
            Busy: ``wait`` is false and another thread is building messages.
        """
        captured = self.outbox.build(calls, wait=wait)
        by_id = {item.task_id: item for item in captured or ()}
        if captured is None or any(not by_id.get(c.task_id, _EMPTY).commands for c in calls):
            return None
        keys: list[str] = []
        args: list[str | int | bytes] = [self._expires, "sent"]
        for call in calls:
            item = by_id[call.task_id]
            keys.append(self._marker(call))
            args.append(len(item.commands))
            for name, key, value in item.commands:
                keys.append(key)
                args += [name, value]
        return keys, args

    def abandoned(self, call: PreparedCall) -> bool:
        """True when ``call`` has neither a claim nor a result: nobody will publish it.

        A call published here whose ``sent`` marker could not be written yet is never
        abandoned: the marker is written now (once Redis answers again).

        Raises:
            redis.RedisError: Redis did not answer.
        """
        with self._lock:
            unmarked = call.task_id in self._unmarked
        if unmarked:
            self._mark_sent([call], 0.0)
            return False
        key = self.app.backend.get_key_for_task(call.task_id)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.exists(self._marker(call))
            pipe.exists(key)
            marker, result = pipe.execute()
        return not marker and not result

    def _marker(self, call: PreparedCall) -> str:
        return call_marker_key(self._prefix, call.task_id)

    def _claim(self, calls: Sequence[PreparedCall], token: str) -> list[PreparedCall]:
        """The calls claimed with ``token`` (by this attempt or an earlier try of it)."""
        backoff = Backoff(CLAIM_RETRY_SECONDS)
        retried = False
        while True:
            try:
                with self._client.pipeline(transaction=False) as pipe:
                    for call in calls:
                        pipe.set(self._marker(call), token, nx=True, ex=PENDING_MARKER_TTL)
                    if retried:  # an earlier try may have claimed them, its reply lost
                        for call in calls:
                            pipe.get(self._marker(call))
                    replies = pipe.execute()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Nothing was published yet, so trying again is safe.
                time.sleep(backoff.next_or_raise(exc))
                retried = True
                continue
            held = replies[len(calls) :] if retried else [None] * len(calls)
            return [
                c
                for c, ok, value in zip(calls, replies[: len(calls)], held, strict=True)
                if ok or _text(value) == token
            ]

    def _mark_sent(self, calls: Sequence[PreparedCall], within: float) -> None:
        """Mark published calls ``sent``, retrying for ``within`` seconds; calls still
        unmarked then are remembered (:meth:`abandoned` marks them later)."""
        ids = {c.task_id for c in calls}
        backoff = Backoff(within)
        while True:
            try:
                with self._client.pipeline(transaction=False) as pipe:
                    for call in calls:
                        pipe.set(self._marker(call), "sent", ex=self._expires)
                    pipe.execute()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = backoff.next()
                if delay is not None:
                    time.sleep(delay)
                    continue
                log.warning(
                    "%d published call(s) not yet marked sent (%r); their waiters retry",
                    len(calls),
                    exc,
                )
                with self._lock:
                    self._unmarked |= ids
                return
            with self._lock:
                self._unmarked -= ids
            return

    def close(self) -> None:
        """Close this publisher's broker connections."""
        self.outbox.close()

    def _release(self, calls: Sequence[PreparedCall]) -> None:
        try:
            self._client.delete(*[self._marker(call) for call in calls])
        except redis.RedisError:  # the claims expire on their own
            log.warning("could not release %d claim(s)", len(calls))


class Backoff:
    """Delays between tries while Redis does not answer: 0.1 s, doubling up to 2 s, as
    long as the next try starts within ``window`` seconds of the first."""

    def __init__(self, window: float) -> None:
        self._deadline = time.monotonic() + window
        self._delay = 0.1

    def next(self) -> float | None:
        """The delay before the next try; ``None`` when that would be past the window."""
        delay = self._delay
        if time.monotonic() + delay > self._deadline:
            return None
        self._delay = min(delay * 2, 2.0)
        return delay

    def next_or_raise(self, exc: Exception) -> float:
        """:meth:`next`, logged; past the window, ``exc`` (why Redis did not answer)."""
        delay = self.next()
        if delay is None:
            raise exc
        log.warning("Redis unreachable while dispatching; retrying in %.1fs", delay)
        return delay


def _attached(calls: Sequence[PreparedCall], claimed: Sequence[int]) -> list[PreparedCall]:
    """The calls the script did not claim (someone else's), logged."""
    attached = [c for c, ok in zip(calls, claimed, strict=True) if not ok]
    if attached:
        log.info("%d call(s) already dispatched; attaching", len(attached))
    return attached


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None
