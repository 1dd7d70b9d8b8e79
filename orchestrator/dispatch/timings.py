"""How long this orchestrator's calls take to start and to come back, as it sees them.

A dispatcher given a :class:`CallTimings` has each call's observer
(:class:`~orchestrator.observe.CallObserver`) tell it when the call is published, what
its state changes are and when nobody waits for it any more; the timings report, per tool:

- *dispatch to start*: from publishing a call to hearing that a worker started it (the
  queue wait, the worker's fetch, and the start notice's trip back);
- *result wait*: from publishing a call to its result reaching this process.

Nothing here depends on a metrics library: the reports go to the two callbacks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from orchestrator.dispatch.watch import READY_STATES

Report = Callable[[str, float], None]
"""Called with (tool, seconds)."""


class _Call(Protocol):
    @property
    def task_id(self) -> str: ...

    @property
    def tool(self) -> str: ...


class CallTimings:
    """Publication-to-start and publication-to-result times of calls; thread-safe.

    Args:
        on_start: Gets (tool, seconds from publication to the start notice).
        on_result: Gets (tool, seconds from publication to the result).
    """

    def __init__(self, on_start: Report, on_result: Report) -> None:
        self._on_start = on_start
        self._on_result = on_result
        self._lock = threading.Lock()
        self._published: dict[str, tuple[str, float]] = {}
        self._started: set[str] = set()

    def publishing(self, calls: Sequence[_Call]) -> None:
        """The calls are about to be published (their clocks start now)."""
        now = time.monotonic()
        with self._lock:
            for call in calls:
                self._published.setdefault(call.task_id, (call.tool, now))

    def forget(self, task_id: str) -> None:
        """Nobody waits on the call any more (its result came, or it was cancelled)."""
        with self._lock:
            self._published.pop(task_id, None)
            self._started.discard(task_id)

    def state(self, task_id: str, state: str | None) -> None:
        """A call's state changed (the listener reports every change)."""
        now = time.monotonic()
        with self._lock:
            entry = self._published.get(task_id)
            if entry is None:
                return
            tool, since = entry
            first_start = state == "STARTED" and task_id not in self._started
            if first_start:
                self._started.add(task_id)
            ready = state in READY_STATES
            if ready:
                self._published.pop(task_id, None)
                self._started.discard(task_id)
        if first_start:
            self._on_start(tool, now - since)
        if ready:
            self._on_result(tool, now - since)

    def pending(self) -> int:
        """Calls being timed (published and not yet back nor forgotten)."""
        with self._lock:
            return len(self._published)
