"""The soft time limit interrupts the tool only: never the storing of its result, never a
later call (the signal a late timer sends in a prefork pool process)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from billiard.exceptions import SoftTimeLimitExceeded
from billiard.pool import soft_timeout_sighandler

from tool_workers.celery_ext import event_loop, soft_limit
from tool_workers.celery_ext.event_loop import spare_storing_calls
from tool_workers.celery_ext.soft_limit import tool_window


@pytest.fixture
def pool_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's SIGUSR1 handled as in a new prefork pool process (billiard's
    handler, not yet taken over: the takeover is noted once per process)."""
    monkeypatch.setattr(soft_limit, "_looked_in", 0)
    previous = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)
    yield
    signal.signal(signal.SIGUSR1, previous)


def soft_limit_signal() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)  # the handler runs in the main thread between bytecodes


def test_the_soft_limit_stops_a_tool_that_ran_for_its_limit(pool_process: None) -> None:
    with pytest.raises(SoftTimeLimitExceeded), tool_window(0.2):
        time.sleep(0.3)
        soft_limit_signal()


def test_a_soft_limit_after_the_tool_returned_is_ignored(pool_process: None) -> None:
    """Given a tool that finished, when the soft limit arrives late (while its result is
    stored), then nothing is raised: the finished call's result stands."""
    with tool_window(0.2):
        pass
    soft_limit_signal()  # raised SoftTimeLimitExceeded('') before


def test_a_late_soft_limit_of_an_earlier_call_does_not_stop_the_next_one(
    pool_process: None,
) -> None:
    with tool_window(5.0):
        soft_limit_signal()  # 0 s into a call limited to 5 s: not this call's


def test_outside_a_pool_process_the_signal_handler_is_left_alone() -> None:
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        with tool_window(0.1):
            assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_process_that_is_not_a_pool_process_looks_for_the_handler_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a solo worker's process (no billiard handler), its calls' windows ask for
    the signal's handler once, not once per call."""
    monkeypatch.setattr(soft_limit, "_looked_in", 0)
    looked: list[int] = []
    getsignal = signal.getsignal
    monkeypatch.setattr(signal, "getsignal", lambda n: looked.append(n) or getsignal(n))
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        for _ in range(3):
            with tool_window(0.1):
                pass
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert looked == [signal.SIGUSR1]


def test_a_pool_process_storing_a_finished_call_is_spared_by_the_hard_limit(
    pool_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the tool runs the hard limit applies; once it returned (the result is being
    stored) the process reads as storing, until the next call starts."""
    monkeypatch.setattr(soft_limit, "_phases", None)
    soft_limit.share_phases()
    with tool_window(5.0):
        assert not soft_limit.storing(os.getpid())
    assert soft_limit.storing(os.getpid())
    soft_limit.mark(finished=False)  # the next call starts
    assert not soft_limit.storing(os.getpid())
    assert not soft_limit.storing(os.getpid() + soft_limit._SLOTS)  # a slot's other pid


def test_the_event_loops_hard_limit_spares_a_storing_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Job:
        """A job record as billiard's pool keeps one (the fields it reads)."""

        _job = 1
        _time_accepted = 1.0
        _soft_timeout = None
        _timeout = 5.0

        def worker_pids(self) -> list[int]:
            return [4242]

        def ready(self) -> bool:
            return False

    class Pool:
        def __init__(self) -> None:
            self.handled: list[object] = []
            self.on_hard_timeout = self.handled.append

    class TaskPool:
        _pool = Pool()

    pool = TaskPool()
    spare_storing_calls(pool)
    monkeypatch.setattr(event_loop, "storing", lambda pid: True)
    pool._pool.on_hard_timeout(Job())
    assert pool._pool.handled == []
    monkeypatch.setattr(event_loop, "storing", lambda pid: False)
    job = Job()
    pool._pool.on_hard_timeout(job)
    assert pool._pool.handled == [job]
