"""Tests that run alone while the others run in parallel (pytest-xdist).

A test marked ``serial`` bounds a duration where the bound is the point (parallel tool
calls finishing well under their serial time, a throughput floor): under xdist, the
tests of the other processes would share its two cores and the bound would measure
them. So every test of a parallel run holds a lock shared, and a ``serial`` one holds it
alone: it waits until the tests running elsewhere end, and no other starts meanwhile.

The lock is two ``flock`` files named by the run's id (xdist's ``testrunuid``), so
concurrent runs never wait for each other. A turnstile lets a waiting ``serial`` test in
first: without it, the other processes' tests, one always running, would starve it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

RUN_UID = "PYTEST_XDIST_TESTRUNUID"
"""Set by pytest-xdist in each worker process: the id of the whole run."""


def lock_paths(run_uid: str) -> tuple[Path, Path]:
    """The turnstile and the lock of run ``run_uid``."""
    base = Path(tempfile.gettempdir()) / f"toolfleet-tests-{run_uid}"
    return base.with_suffix(".turnstile"), base.with_suffix(".lock")


def share_run_uid(config: pytest.Config) -> None:
    """In the xdist controller: choose the run's id (xdist's ``--testrunuid``) unless
    given, so the lock files can be deleted when the run ends (:func:`remove_locks`)."""
    if hasattr(config, "workerinput") or not hasattr(config.option, "testrunuid"):
        return
    if not config.option.testrunuid:
        config.option.testrunuid = uuid.uuid4().hex


def remove_locks(config: pytest.Config) -> None:
    """In the xdist controller, once its workers are gone: delete the run's lock files."""
    if hasattr(config, "workerinput") or not getattr(config.option, "testrunuid", None):
        return
    for path in lock_paths(config.option.testrunuid):
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _flocked(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def turn(alone: bool) -> Iterator[None]:
    """Hold this run's lock for one test: shared, or ``alone`` (exclusive). Outside an
    xdist worker (``-n 0``, a plain run) tests run one at a time already: nothing held."""
    run_uid = os.environ.get(RUN_UID)
    if not run_uid:
        yield
        return
    turnstile, lock = lock_paths(run_uid)
    if alone:
        with _flocked(turnstile, fcntl.LOCK_EX), _flocked(lock, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as held:
        with _flocked(turnstile, fcntl.LOCK_EX):
            held.enter_context(_flocked(lock, fcntl.LOCK_SH))
        yield
