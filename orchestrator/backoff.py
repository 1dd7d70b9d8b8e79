"""The delays between tries of everything that reconnects to, or retries against, Redis,
and the one pub/sub subscription loop every channel toolfleet listens on uses.

Each delay is random, up to a bound that starts at 0.1 s and doubles to 2 s (redis-py's
:class:`~redis.backoff.ExponentialWithJitterBackoff`), so the processes that lost the
same server do not all try again at the same instant.

:func:`subscribe_forever` subscribes, hands each message on, and after a lost connection
subscribes again after such a delay. Pub/sub keeps nothing for a subscriber that was
away, so each (re)subscription is announced to the caller: that is where it catches up
with what was published meanwhile (the result listener reads the keys of the calls it
waits for; the control channel's runs find a cancel request in their records).

:func:`retried` runs one command (or pipeline, or script) against Redis and, after a lost
connection, runs it again after such delays for a bounded time: a blip of the link is
then no error of whoever asked. The command must be safe to run again, since a
connection can be lost after the server applied it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")

LOST = (RedisConnectionError, RedisTimeoutError, OSError)
"""Errors of a lost link (not of a command Redis refused): worth the same command again."""

log = logging.getLogger("toolfleet")

FIRST = 0.1
"""Seconds: the bound of the first delay."""

CAP = 2.0
"""Seconds: the longest delay."""

_DOUBLINGS = math.ceil(math.log2(CAP / FIRST))
"""Failures after which the bound passes the cap. Counting no further keeps the delays
random: redis-py draws a delay below the bound, then caps it, so with a bound far above
the cap nearly every delay would be the cap. It also keeps ``2**failures`` small
(redis-py 6.4 raises OverflowError past 1023 failures)."""


class Backoff:
    """Delays between tries: ``next()`` after each failure, ``reset()`` after a success.

    Args:
        until: A ``time.monotonic()`` instant no delay passes; ``None``: none.
    """

    def __init__(self, until: float | None = None) -> None:
        self._delays = ExponentialWithJitterBackoff(cap=CAP, base=FIRST)
        self._until = until
        self._failures = 0

    def next(self) -> float:
        """A try failed: the seconds to wait before the next one."""
        delay = self._delays.compute(self._failures)
        self._failures = min(self._failures + 1, _DOUBLINGS)
        if self._until is not None:
            delay = max(0.0, min(delay, self._until - time.monotonic()))
        return delay

    def reset(self) -> None:
        """A try succeeded: the next failure waits a first delay again."""
        self._failures = 0


async def retried(attempt: Callable[[int], Awaitable[T]], *, within: float, what: str) -> T:
    """``await attempt(n)`` (``n``: the tries before this one) until it returns, trying
    again after a lost link until ``within`` seconds have passed since the first loss.

    Raises:
        The last try's error: a lost link for longer than ``within``, or any other error
        at once.
    """
    tries, until, backoff = 0, math.inf, None
    while True:
        try:
            return await attempt(tries)
        except LOST as exc:
            now = time.monotonic()
            if backoff is None:  # the first loss: nothing of this is made for a success
                backoff, until = Backoff(), now + within
                log.warning("%s lost Redis (%r); trying again for %.1f s", what, exc, within)
            if now >= until:
                raise
            tries += 1
            await asyncio.sleep(min(backoff.next(), until - now))


def cancel_pending() -> bool:
    """Whether the running task has been asked to stop. A loop that retries on Redis
    errors checks it before retrying: redis-py may end a command cancelled mid-read with
    a ``TimeoutError`` or ``ConnectionError`` of its own, and the loop would take the
    cancellation for a lost connection and go on (and whoever awaits it, for ever)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def raise_if_cancelled(error: BaseException) -> None:
    """Re-raise as the cancellation it is an ``error`` a Redis call ended with when the
    running task was cancelled during it (:func:`cancel_pending`); else return."""
    if cancel_pending():
        raise asyncio.CancelledError from error


READ_TIMEOUT = 1.0
"""Seconds one read waits for a message before the stop condition is checked again
(redis-py may turn a cancellation inside a read into a timeout)."""


async def subscribe_forever(
    client: Any,
    channel: str | bytes,
    on_message: Callable[[Any], object],
    *,
    what: str,
    on_subscribed: Callable[[], object] | None = None,
    on_lost: Callable[[BaseException], object] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Listen on ``channel`` until cancelled or ``stopping()``; resubscribe after a loss.

    Args:
        client: A ``redis.asyncio`` client.
        channel: The channel.
        on_message: Called with the data of each message.
        what: What the subscription is, for the log line of a loss.
        on_subscribed: Called after each (re)subscription: catch up there with what was
            published while the subscription was down.
        on_lost: Called with the error when the subscription is lost.
        stopping: Checked between reads: true ends the subscription.
    """
    backoff = Backoff()
    while not stopping():
        try:
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(channel)
                while not stopping():
                    message = await pubsub.get_message(timeout=READ_TIMEOUT)
                    if cancel_pending():  # one the read turned into a timeout
                        raise asyncio.CancelledError
                    if message is None:
                        continue
                    if message["type"] == "message":
                        on_message(message["data"])
                    elif message["type"] == "subscribe":
                        backoff.reset()
                        if on_subscribed is not None:
                            on_subscribed()
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # untyped before redis-py 8
        except (RedisError, OSError) as exc:
            log.warning("%s lost (%r); subscribing again", what, exc)
            if on_lost is not None:
                on_lost(exc)
            await asyncio.sleep(backoff.next())
        except Exception as exc:  # a bug must not silence every later message
            log.exception("%s failed; subscribing again", what)
            if on_lost is not None:
                on_lost(exc)
            await asyncio.sleep(backoff.next())
