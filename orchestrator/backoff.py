"""The delays between tries of everything that reconnects to, or retries against, Redis.

Each delay is random, up to a bound that starts at 0.1 s and doubles to 2 s (redis-py's
:class:`~redis.backoff.ExponentialWithJitterBackoff`), so the processes that lost the
same server do not all try again at the same instant.
"""

from __future__ import annotations

import math
import time

from redis.backoff import ExponentialWithJitterBackoff

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
