"""What a dispatcher keeps per watched call, and how it tells observers: the table a
transport hands each call's states into."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("toolfleet.results")

READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
"""Celery states after which a task's result no longer changes."""

PROGRESS = "PROGRESS"
"""Pseudo-state with which state callbacks receive a running call's progress events."""

StateCallback = Callable[[str, str | None, dict[str, Any]], None]
"""Called with (task id, Celery state, meta) when a watched task's state changes.

The state is the meta's ``status`` (``None`` in a meta without one).
"""


@dataclass
class Watch:
    """One watched call: its future, its observers and its liveness."""

    future: concurrent.futures.Future[dict[str, Any]]
    since: float = field(default_factory=time.monotonic)
    waiters: int = 1
    on_state: list[StateCallback] = field(default_factory=list)
    last_state: str | None = None
    last_activity: float | None = None
    progress_seq: int = 0


def notify(
    callbacks: Iterable[StateCallback], task_id: str, state: str | None, meta: dict[str, Any]
) -> None:
    """Tell each observer; an observer that fails never stops result delivery."""
    for callback in callbacks:
        try:
            callback(task_id, state, meta)
        except Exception:
            log.exception("result state callback failed")


class WatchTable:
    """The watched calls of one listener, by task id; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watches: dict[str, Watch] = {}

    def watch(
        self, task_ids: Iterable[str], on_state: StateCallback | None = None
    ) -> dict[str, concurrent.futures.Future[dict[str, Any]]]:
        """Futures resolving to each call's ready Celery meta.

        Watching a call that is already watched shares its future. Call :meth:`release`
        once per watch when the result is no longer wanted.

        Args:
            task_ids: The calls.
            on_state: Called on every state change (from the thread that delivers it).
        """
        futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        with self.lock:
            for task_id in task_ids:
                watch = self.watches.get(task_id)
                if watch is None:
                    watch = Watch(concurrent.futures.Future())
                    self.watches[task_id] = watch
                else:
                    watch.waiters += 1
                if on_state is not None:
                    watch.on_state.append(on_state)
                futures[task_id] = watch.future
        return futures

    def release(self, task_id: str) -> None:
        """Drop one watch of ``task_id``."""
        with self.lock:
            watch = self.watches.get(task_id)
            if watch is None:
                return
            watch.waiters -= 1
            if watch.waiters > 0:
                return
            del self.watches[task_id]
        if not watch.future.done():
            watch.future.cancel()

    def pending(self) -> int:
        """How many calls are watched now."""
        with self.lock:
            return len(self.watches)

    def close(self) -> None:
        """Drop every watch; pending futures are cancelled."""
        with self.lock:
            watches = list(self.watches.values())
            self.watches.clear()
        for watch in watches:
            watch.future.cancel()

    def deliver_reply(self, raw: bytes) -> None:
        """A message on the reply channel: a state or a progress batch of some call."""
        try:
            meta = json.loads(raw)
        except ValueError:
            log.error("unreadable state on the reply channel")
            return
        task_id = meta.get("task_id") if isinstance(meta, dict) else None
        if not isinstance(task_id, str):
            return
        if "progress" in meta:
            self.apply_progress(task_id, meta)
        else:
            self.apply(task_id, meta)

    def apply_progress(self, task_id: str, meta: dict[str, Any]) -> None:
        """A batch of a running call's progress events: to the callbacks, in order."""
        seq = meta.get("seq")
        with self.lock:
            watch = self.watches.get(task_id)
            if watch is None or watch.future.done():
                return
            if isinstance(seq, int):
                if seq <= watch.progress_seq:
                    return  # already seen
                watch.progress_seq = seq
            watch.last_activity = time.monotonic()
            callbacks = list(watch.on_state)
        notify(callbacks, task_id, PROGRESS, meta)

    def last_activity(self, task_id: str) -> float | None:
        """When (monotonic) a started call last showed life; ``None`` if not started."""
        with self.lock:
            watch = self.watches.get(task_id)
            return watch.last_activity if watch is not None else None

    def deliver(self, task_id: str, raw: bytes | str | None) -> None:
        """A stored state of ``task_id`` (raw JSON meta)."""
        if raw is None:
            return
        try:
            meta = json.loads(raw)
        except ValueError:
            log.error("unreadable result for task %s", task_id)
            return
        if isinstance(meta, dict):
            self.apply(task_id, meta)

    def apply(self, task_id: str, meta: dict[str, Any]) -> None:
        """A decoded state: observers hear of changes; a ready state resolves the future."""
        state = meta.get("status")
        with self.lock:
            watch = self.watches.get(task_id)
            if watch is None or watch.future.done():
                return
            changed = state != watch.last_state
            watch.last_state = state
            if state == "STARTED" and watch.last_activity is None:
                watch.last_activity = time.monotonic()
            callbacks = list(watch.on_state) if changed else []
        notify(callbacks, task_id, state, meta)
        if state in READY_STATES:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                watch.future.set_result(meta)
