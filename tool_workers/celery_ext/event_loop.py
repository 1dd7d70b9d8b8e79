"""Keep a worker's time limits on time while its event loop is held up by the network.

With the prefork pool, a call's soft and hard time limits are timers of the worker's
event loop (kombu's hub) in the main process. On a network cut that loop is held up: each
broker command on the dead link waits out its socket timeout, and while the consumer
reconnects (Celery retries from the main thread) the loop does not turn at all. Time
limits then fired only after the link came back, tens of seconds late, and a tool past
its hard limit kept running (and making side effects) for as long as the cut lasted.

* :class:`LimitWatchdog` enforces each running call's limits on time from a thread of its
  own with billiard's own handlers (the ones its threaded pools run from a timeout
  thread), only where the loop is late: half a second past the soft limit the soft-limit
  signal (cancelling the loop's own timer for it), one second past the hard limit the
  kill and the timeout result. A loop timer that fires anyway finds the call ended, and
  the pool process ignores a duplicate soft-limit signal
  (:mod:`tool_workers.celery_ext.soft_limit`).
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
from collections.abc import Callable
from typing import Any

from tool_workers.celery_ext.soft_limit import storing
from tool_workers.compat import billiard as billiard_compat
from tool_workers.compat import celery as celery_compat

log = logging.getLogger("toolfleet.worker")

TICK = 0.25
"""Seconds between two checks of the running calls."""

SOFT_GRACE = 0.5
"""Seconds past its soft limit the event loop has to signal a call before the watchdog does."""

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
        pool: Celery's prefork ``TaskPool``. Its billiard pool keeps each running job's
            record: when a pool process accepted the job, its soft and hard limits and
            the pool process's pid (read through :mod:`tool_workers.compat.billiard`).
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
        pool = celery_compat.billiard_pool(self._pool)  # each time: a restart replaces it
        if pool is None or _SOFT_SIGNAL is None:
            return
        jobs = billiard_compat.running_jobs(pool)
        keys = {job.key for job in jobs}
        self._signalled &= keys
        self._killed &= keys
        for job in jobs:
            key, accepted, pid = job.key, job.accepted, job.pid
            if not (accepted and pid) or job.ready:
                continue
            soft, hard = job.soft, job.hard
            if hard and key not in self._killed and now - accepted >= hard + HARD_GRACE:
                if storing(pid):
                    continue  # the tool returned; its result is on its way (soft_limit)
                # The kill first: billiard's handler stores the timeout result before it
                # kills, and that store waits for the link. Then the handler (its threaded
                # pools run it from a thread like this one) makes the call's result
                # TimeLimitExceeded, so the exit is not taken for a lost worker.
                self._killed.add(key)
                log.warning("hard time limit (%gs) exceeded for job %s", hard, key)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                celery_compat.hard_limit(pool, job.job)
            elif soft and key not in self._signalled and now - accepted >= soft + SOFT_GRACE:
                # Taken over from the event loop: its timer would fire a second signal
                # when it turns again; the hard limit is then this watchdog's too. No
                # pending timer: the event loop fired it (it now holds the hard limit's).
                if not celery_compat.take_soft_timer(pool, key):
                    continue
                self._signalled.add(key)
                log.warning("soft time limit (%gs) exceeded for job %s", soft, key)
                celery_compat.soft_limit(pool, job.job)


_SOFT_SIGNAL = getattr(signal, "SIGUSR1", None)  # no soft limits where it is missing


def spare_storing_calls(pool: Any) -> None:
    """Make the event loop's hard limit spare a call whose tool has returned.

    billiard's handler would kill the pool process while it stores the finished call's
    result (a store waiting for a cut link), and the call would reach the model as timed
    out although it finished. Such a process ends by itself when the store succeeds or
    gives up.

    Args:
        pool: Celery's prefork ``TaskPool``, started.
    """

    def spare(record: Any, handler: Callable[[Any], None]) -> None:
        job = billiard_compat.job_view(record)
        if job.pid and storing(job.pid):
            log.warning("hard time limit of job %s reached while it stores its result: spared",
                        job.key)  # fmt: skip
            return
        handler(record)

    celery_compat.intercept_hard_limit(celery_compat.billiard_pool(pool), spare)
