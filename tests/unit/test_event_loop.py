"""Time limits that do not wait for the worker's event loop (the watchdog), and reconnect
attempts at a steady pace."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from tool_workers.celery_ext.event_loop import (
    RECONNECT_INTERVAL,
    LimitWatchdog,
    steady_retries,
)


@dataclass
class Job:
    """A job record as billiard's pool keeps one (the fields it reads)."""

    _time_accepted: float | None
    _soft_timeout: float | None
    _worker_pid: int | None
    _timeout: float | None = 60.0
    done: bool = False
    _job: int = 0

    def ready(self) -> bool:
        return self.done

    def worker_pids(self) -> list[int]:
        return [self._worker_pid] if self._worker_pid else []


class Entry:
    """A timer entry of the event loop (kombu's), as the pool keeps one per job."""

    def __init__(self, name: str) -> None:
        def fun() -> None: ...

        fun.__name__ = name
        self.fun = fun
        self.canceled = False

    def cancel(self) -> None:
        self.canceled = True


@dataclass
class Billiard:
    """The parts of billiard's pool the watchdog uses; its handlers act as billiard's."""

    _cache: dict[int, Job] = field(default_factory=dict)
    hard: list[Job] = field(default_factory=list)
    _tref_for_id: dict[int, Entry] = field(default_factory=dict)

    def on_soft_timeout(self, job: Job) -> None:
        assert job._worker_pid is not None
        os.kill(job._worker_pid, signal.SIGUSR1)

    def on_hard_timeout(self, job: Job) -> None:
        self.hard.append(job)


@dataclass
class TaskPool:
    _pool: Billiard


def test_the_watchdog_signals_a_job_past_its_soft_limit_once() -> None:
    """Given a running job past its soft limit and one within it, then only the first
    pool process gets the soft-limit signal, and only once."""
    overdue = subprocess.Popen(["sleep", "30"])
    within = subprocess.Popen(["sleep", "30"])
    try:
        now = time.monotonic()
        pool = Billiard({1: Job(now - 7, 6.0, overdue.pid), 2: Job(now - 1, 6.0, within.pid)})
        pool._tref_for_id = {1: Entry("_on_soft_timeout"), 2: Entry("_on_soft_timeout")}
        watchdog = LimitWatchdog(TaskPool(pool))

        watchdog.check(now)
        watchdog.check(now + 0.5)  # already signalled: not again

        assert overdue.wait(timeout=5) == -signal.SIGUSR1
        assert within.poll() is None
        assert pool._tref_for_id[1].canceled  # the event loop's own signal is called off
    finally:
        for proc in (overdue, within):
            proc.kill()
            proc.wait()


def test_the_watchdog_leaves_a_soft_limit_the_event_loop_fired_alone() -> None:
    """Given a job past its soft limit whose timer already fired (the pool now holds its
    hard-limit timer), then the watchdog sends no second signal."""
    running = subprocess.Popen(["sleep", "30"])
    try:
        now = time.monotonic()
        pool = Billiard({1: Job(now - 7, 6.0, running.pid)})
        pool._tref_for_id = {1: Entry("_on_hard_timeout")}
        LimitWatchdog(TaskPool(pool)).check(now)
        time.sleep(0.2)
        assert running.poll() is None
    finally:
        running.kill()
        running.wait()


def test_the_watchdog_leaves_finished_and_unaccepted_jobs_alone() -> None:
    now = time.monotonic()
    pool = Billiard(
        {
            1: Job(now - 60, 6.0, 999_999_999, done=True),
            2: Job(None, 6.0, None),
            3: Job(now - 60, None, 1),
        }
    )
    LimitWatchdog(TaskPool(pool)).check(now)  # would raise or kill pid 1 otherwise


def test_the_watchdog_kills_a_job_the_event_loop_left_past_its_hard_limit() -> None:
    """Given a job past its hard limit (plus the grace the event loop has to end it), then
    its pool process is killed and billiard's hard-limit handler runs for it, once."""
    stuck = subprocess.Popen(["sleep", "30"])
    within = subprocess.Popen(["sleep", "30"])
    try:
        now = time.monotonic()
        job = Job(now - 9.5, 4.0, stuck.pid, _timeout=8.0)
        pool = Billiard({1: job, 2: Job(now - 8.5, None, within.pid, _timeout=8.0)})
        watchdog = LimitWatchdog(TaskPool(pool))
        watchdog.check(now)
        watchdog.check(now + 0.1)
        assert stuck.wait(timeout=5) == -signal.SIGKILL
        assert pool.hard == [job]
        assert within.poll() is None
    finally:
        for proc in (stuck, within):
            proc.kill()
            proc.wait()


def test_reconnect_attempts_follow_each_other_every_second() -> None:
    calls: list[dict[str, Any]] = []

    class Conn:
        def ensure_connection(self, *args: Any, **kwargs: Any) -> None:
            calls.append(kwargs)

    conn = steady_retries(Conn())
    conn.ensure_connection(None, 5, callback=None)
    assert calls[0]["interval_start"] == RECONNECT_INTERVAL
    assert calls[0]["interval_max"] == RECONNECT_INTERVAL
    assert calls[0]["interval_step"] == 0
