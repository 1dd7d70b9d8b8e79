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
from typing import Any

from tool_workers.celery_ext.soft_limit import storing

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
                pool.on_hard_timeout(job)
            elif soft and key not in self._signalled and now - accepted >= soft + SOFT_GRACE:
                entry = _soft_entry(pool, key)
                if entry is None:
                    continue  # the event loop fired it (it now holds the hard limit's)
                # Taken over from the event loop: its entry would fire a second signal
                # when it turns again; the hard limit is then this watchdog's too.
                self._signalled.add(key)
                entry.cancel()
                log.warning("soft time limit (%gs) exceeded for job %s", soft, key)
                pool.on_soft_timeout(job)


def _soft_entry(pool: Any, key: Any) -> Any:
    """The event loop's pending soft-limit timer of job ``key``, or ``None``."""
    entry = pool._tref_for_id.get(key)
    if entry is None or entry.canceled:
        return None
    return entry if getattr(entry.fun, "__name__", "") == "_on_soft_timeout" else None


_SOFT_SIGNAL = getattr(signal, "SIGUSR1", None)  # no soft limits where it is missing


def spare_storing_calls(pool: Any) -> None:
    """Make the event loop's hard limit spare a call whose tool has returned.

    billiard's handler would kill the pool process while it stores the finished call's
    result (a store waiting for a cut link), and the call would reach the model as timed
    out although it finished. Such a process ends by itself when the store succeeds or
    gives up.
    """
    handler = pool._pool.on_hard_timeout

    def on_hard_timeout(job: Any) -> None:
        if job._worker_pid and storing(job._worker_pid):
            log.warning("hard time limit of job %s reached while it stores its result: spared",
                        job._job)  # fmt: skip
            return
        handler(job)

    pool._pool.on_hard_timeout = on_hard_timeout
