"""The soft time limit stops the tool, and only the tool.

In a prefork pool process, Celery's soft time limit is a ``SIGUSR1`` from the worker's
main process, and billiard's handler raises ``SoftTimeLimitExceeded`` wherever the pool
process happens to be. When the main process's timers run late (a network cut held up its
event loop), the signal could arrive after the tool had returned, while the result was
being stored: the store was interrupted and the call reached the model as a bare
``SoftTimeLimitExceeded('')`` failure, although the tool had finished in time. A late
duplicate could even interrupt the next call.

:func:`tool_window` replaces that handler in the pool process: the exception is raised
only while a tool runs (inside the window) and only once the call has really run for its
soft limit; a signal outside the window, or one meant for an earlier call, is logged and
ignored.

The hard time limit still ends a tool that does not finish, but not the storing of a
finished call's result: a pool process records in a table it shares with the worker's
main process (:func:`share_phases`, created before the pool forks) whether its tool has
returned, and the hard limit spares a process that is only storing a result
(:func:`storing`); the store gives up by itself after its retry window.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded

from tool_workers.compat import billiard as billiard_compat

log = logging.getLogger("toolfleet.worker")

SLACK = 0.5
"""Seconds before its soft limit at which a call may already be stopped (timer jitter)."""

_SIGNAL = getattr(signal, "SIGUSR1", None)  # absent on Windows, where prefork has no limits


@dataclass
class _Window:
    started: float
    limit: float | None


_current: _Window | None = None

_SLOTS = 4096
_phases: Any = None  # slot pid % _SLOTS: 2 * pid + finished; shared with the pool
_looked_in = 0  # the process that looked for billiard's soft-limit handler (0: none yet)
_installed = False  # whether it found one (and put _handler in its place)


def share_phases() -> None:
    """Create the phase table in the worker's main process, before the pool forks."""
    global _phases
    if _phases is None:
        _phases = multiprocessing.RawArray("q", _SLOTS)


def mark(finished: bool) -> None:
    """Record in this pool process's slot whether its call's tool has returned (one
    aligned 8-byte write: the main process never reads half of it)."""
    if _phases is not None:
        pid = os.getpid()
        _phases[pid % _SLOTS] = 2 * pid + finished


def storing(pid: int) -> bool:
    """Whether pool process ``pid`` has run its call's tool and is storing the result.

    Two pool processes sharing a slot read as "not storing": the limit then applies.
    """
    if _phases is None:
        return False
    return bool(_phases[pid % _SLOTS] == 2 * pid + 1)


def _handler(signum: int, frame: FrameType | None) -> None:
    window = _current
    if window is None:
        log.warning("soft time limit signal after the tool finished: ignored")
        return
    elapsed = time.monotonic() - window.started
    if window.limit is not None and elapsed < window.limit - SLACK:
        log.warning(
            "soft time limit signal %.1f s into a call limited to %g s: meant for an "
            "earlier call, ignored",
            elapsed,
            window.limit,
        )
        return
    raise SoftTimeLimitExceeded()


def _install() -> bool:
    """Take over billiard's soft-limit handler; whether this process has one (looked for
    once per process, found or not: ``signal.getsignal`` costs more than the rest of a
    call's window, and billiard installs its handler as a pool process starts)."""
    global _looked_in, _installed
    if _SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return False
    pid = os.getpid()
    if _looked_in == pid:
        return _installed
    current = signal.getsignal(_SIGNAL)
    _installed = current is _handler or billiard_compat.is_soft_limit_handler(current)
    if _installed and current is not _handler:
        signal.signal(_SIGNAL, _handler)
    # Not a prefork pool process: its signals are left alone.
    _looked_in = pid
    return _installed


@contextlib.contextmanager
def tool_window(limit: float | None) -> Iterator[None]:
    """Let the soft time limit interrupt the block (the tool's run), and nothing else.

    Args:
        limit: The call's soft limit in seconds (``None``: any soft-limit signal counts).
    """
    global _current
    if not _install():
        yield
        return
    _current = _Window(started=time.monotonic(), limit=limit)
    mark(finished=False)
    try:
        yield
    finally:
        _current = None
        mark(finished=True)
