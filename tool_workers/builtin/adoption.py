"""The pool process's side of keeping a ``run_python`` call's tree: while calls run, the
process is a child subreaper, so when a supervisor dies before it cleaned up (killed by a
snippet of the worker's own user, or crashed), its orphans come back to this process and
are killed here. A supervisor that ended normally left nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import psutil

from tool_workers.builtin import supervisor

__all__ = ["ADOPTION", "Adoption"]


class Adoption:
    """Makes this process a child subreaper while run_python calls are running, and
    kills what a supervisor that died left behind (its orphans come back here)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self._calls = 0

    def enter(self) -> None:
        """A call starts: the first one makes this process a subreaper."""
        with self._lock:
            if self._calls == 0:
                supervisor.set_child_subreaper(True)
            self._calls += 1

    def started(self, pid: int) -> None:
        """The call's supervisor is ``pid``: never taken for another call's orphan."""
        with self._lock:
            self._live.add(pid)

    def leave(self, pid: int | None, started_at: float, orphans: bool) -> None:
        """A call ended; with ``orphans``, first kill (and reap) every child of this
        process started since ``started_at`` (epoch seconds) that is no running call's
        supervisor, and their descendants, until none is left. The last call out stops
        being a subreaper."""
        with self._lock:
            self._live.discard(pid or 0)
            try:
                if orphans:
                    self._kill_orphans(started_at)
            finally:
                self._calls -= 1
                if self._calls == 0:
                    supervisor.set_child_subreaper(False)

    def _kill_orphans(self, started_at: float) -> None:
        # Children of this process started during the call that are not another call's
        # supervisor: the dead supervisor's tree, reparented here.
        me = psutil.Process()

        def ours(proc: psutil.Process) -> bool:
            try:
                return proc.pid not in self._live and proc.create_time() >= started_at - 1
            except psutil.Error:
                return False

        while True:
            orphans = [proc for proc in me.children() if ours(proc)]
            if not orphans:
                return
            for proc in orphans:
                supervisor.kill_descendants(proc)
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGKILL)
            for proc in orphans:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(proc.pid, 0)


ADOPTION = Adoption()
"""The process's one instance: run_python calls share it (a threads pool runs several)."""
