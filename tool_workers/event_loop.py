"""Keep a worker's time limits on time while its event loop is held up by the network.

With the prefork pool, a call's soft and hard time limits are timers of the worker's
event loop (kombu's hub) in the main process. On a network cut that loop is held up: each
broker command on the dead link waits out its socket timeout, and while the consumer
reconnects (Celery retries from the main thread) the loop does not turn at all. Time
limits then fired only after the link came back, tens of seconds late, and a tool past
its hard limit kept running (and making side effects) for as long as the cut lasted.

* :class:`LimitWatchdog` enforces each running call's limits on time from a thread of its
  own with billiard's own handlers (the ones its threaded pools run from a timeout
  thread): at the soft limit the soft-limit signal, one second past the hard limit (when
  the loop has not acted) the kill and the timeout result. The loop's own timers still
  fire when it turns again: a call already ended is skipped, and the pool process ignores
  a duplicate soft-limit signal (:mod:`tool_workers.soft_limit`).
* :func:`steady_retries` makes the reconnect attempts follow each other every second
  instead of backing off to 30 s, so a healed link is used again within seconds.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from typing import Any

log = logging.getLogger("toolfleet.worker")

TICK = 0.25
"""Seconds between two checks of the running calls."""

HARD_GRACE = 1.0
"""Seconds past its hard limit the event loop has to end a call before the watchdog does."""

RECONNECT_INTERVAL = 1.0
"""Seconds between reconnect attempts (each also waits up to the connect timeout)."""


def steady_retries(conn: Any) -> Any:
    """``conn`` with reconnect attempts every :data:`RECONNECT_INTERVAL` seconds.

    kombu backs off from 2 s to 30 s between attempts; after a minute's cut the next
    attempt could come half a minute after the link healed.
    """
    conn.ensure_connection = functools.partial(
        conn.ensure_connection,
        interval_start=RECONNECT_INTERVAL,
        interval_step=0,
        interval_max=RECONNECT_INTERVAL,
    )
    return conn


class LimitWatchdog:
    """Signals (soft limit) or kills (hard limit) the pool processes of overdue calls.

    Args:
        pool: Celery's prefork ``TaskPool``. Its billiard pool's ``_cache`` maps each
            running job to its result, which records when a pool process accepted the
            job, its soft and hard limits and the pool process's pid.
    """

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._signalled: set[Any] = set()
        self._killed: set[Any] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolfleet-time-limits", daemon=True)

    def start(self) -> LimitWatchdog:
        """Start watching (a daemon thread; not where there is no soft-limit signal)."""
        if _SOFT_SIGNAL is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            try:
                self.check(time.monotonic())
            except Exception:  # the pool's bookkeeping changed under us: next tick
                log.debug("time-limit check failed", exc_info=True)

    def check(self, now: float) -> None:
        """Act on every running call past a limit (each signal or kill once)."""
        pool = self._pool._pool  # read each time: a pool restart replaces it
        if pool is None or _SOFT_SIGNAL is None:
            return
        jobs = dict(pool._cache)  # one atomic copy; the main thread keeps changing it
        self._signalled &= set(jobs)
        self._killed &= set(jobs)
        for key, job in jobs.items():
            accepted, pid = job._time_accepted, job._worker_pid
            if not (accepted and pid) or job.ready():
                continue
            soft, hard = job._soft_timeout, job._timeout
            if hard and key not in self._killed and now - accepted >= hard + HARD_GRACE:
                # The kill first: billiard's handler stores the timeout result before it
                # kills, and that store waits for the link. Then the handler (its threaded
                # pools run it from a thread like this one) makes the call's result
                # TimeLimitExceeded, so the exit is not taken for a lost worker.
                self._killed.add(key)
                log.warning("hard time limit (%gs) exceeded for job %s", hard, key)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                pool.on_hard_timeout(job)
            elif soft and key not in self._signalled and now - accepted >= soft:
                self._signalled.add(key)
                log.warning("soft time limit (%gs) exceeded for job %s", soft, key)
                pool.on_soft_timeout(job)


_SOFT_SIGNAL = getattr(signal, "SIGUSR1", None)  # no soft limits where it is missing
