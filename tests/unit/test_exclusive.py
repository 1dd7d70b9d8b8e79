"""The lock that lets a ``serial`` test run alone in a parallel (xdist) run."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.support.exclusive import RUN_UID, lock_paths, turn


@pytest.fixture
def run_uid(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    uid = f"unit-{uuid.uuid4().hex}"
    monkeypatch.setenv(RUN_UID, uid)
    yield uid
    for path in lock_paths(uid):
        path.unlink(missing_ok=True)


def hold(alone: bool, entered: threading.Event, release: threading.Event) -> threading.Thread:
    def body() -> None:
        with turn(alone):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_a_serial_test_waits_for_running_tests_and_goes_before_new_ones(run_uid: str) -> None:
    """Given a test running (the lock held shared), when a serial test asks for it, then
    it waits until that test ends, and a test asking after it waits for it in turn."""
    running, end_running = threading.Event(), threading.Event()
    first = hold(False, running, end_running)
    assert running.wait(10)

    serial, end_serial = threading.Event(), threading.Event()
    alone = hold(True, serial, end_serial)
    assert not serial.wait(0.3)  # the running test still holds it

    later, end_later = threading.Event(), threading.Event()
    after = hold(False, later, end_later)
    end_running.set()
    assert serial.wait(10)
    assert not later.wait(0.3)  # the serial test runs alone
    end_serial.set()
    assert later.wait(10)
    end_later.set()
    for thread in (first, alone, after):
        thread.join(10)


def test_outside_an_xdist_worker_nothing_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_UID, raising=False)
    with turn(alone=True), turn(alone=True):  # would deadlock if a lock were taken
        pass
