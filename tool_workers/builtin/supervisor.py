"""The per-call supervisor of ``run_python``: one process that owns a snippet's whole tree.

``run_python`` starts this file as a program of its own (``python -s -P <this file>
CONFIG``, with only psutil's directory on ``PYTHONPATH``), never importing the worker, so
the process the snippet can see holds nothing but the config (no broker URL, no
settings). The supervisor:

1. marks itself non-dumpable (a same-user snippet cannot read its memory or environment,
   nor ptrace it) and a *child subreaper*, so every process the snippet starts, even in
   a session of its own or after a double fork, stays its descendant;
2. starts the snippet with per-process rlimits (``RLIMIT_AS`` = the call's memory limit,
   ``RLIMIT_CORE`` 0, ``RLIMIT_NPROC`` as a backstop), as the configured unprivileged
   user when it runs as root;
3. every ~50 ms sums the resident memory and counts the processes of the whole tree, and
   stops the call when either passes the call's limit, the wall-clock timeout passes,
   the worker asks it to stop (SIGTERM) or the worker process is gone;
4. when the call ends, for whatever reason, SIGKILLs and reaps every descendant, over and
   over until it has no child left, and writes one JSON report line to the report fd.

The functions that set the process attributes (:func:`make_undumpable`,
:func:`set_child_subreaper`) and :func:`kill_descendants` are also used by the worker.
This module imports only the standard library and psutil.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

POLL_INTERVAL = 0.05
"""Seconds between two measurements of the snippet's process tree."""

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def make_undumpable() -> None:
    """Mark this process non-dumpable: its ``/proc/<pid>/environ``, ``mem`` and ``fd``
    become root's, and a process of the same user can no longer read them or ptrace it
    (only a process with ``CAP_SYS_PTRACE`` can). No core dump is written either."""
    _prctl(_PR_SET_DUMPABLE, 0)


def set_child_subreaper(on: bool = True) -> None:
    """Make this process (or stop it being) a child subreaper: an orphaned descendant is
    reparented to it instead of to init, so it can still find and kill it."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def reap_children() -> dict[int, int]:
    """Reap every child that has exited; their exit codes by pid (negative: a signal)."""
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = os.waitstatus_to_exitcode(status)


def kill_descendants(root: psutil.Process) -> int:
    """SIGKILL every descendant of ``root``.

    Returns:
        How many processes were signalled.
    """
    signalled = 0
    for proc in root.children(recursive=True):
        try:
            proc.send_signal(signal.SIGKILL)
            signalled += 1
        except psutil.Error:  # gone already, or not ours to signal
            continue
    return signalled


def kill_tree(settle: float = 0.005) -> dict[int, int]:
    """Kill and reap every descendant of this process, repeatedly, until it has no child.

    As a child subreaper every orphan comes back to this process, so "no child left"
    means no descendant left, however the snippet forked.

    Returns:
        The exit codes of the children reaped meanwhile, by pid.
    """
    me = psutil.Process()
    reaped: dict[int, int] = {}
    while True:
        kill_descendants(me)
        reaped.update(reap_children())
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        time.sleep(settle)


@dataclass(frozen=True)
class Config:
    """What one call asks of the supervisor (passed as JSON on its command line)."""

    python: str
    script: str
    cwd: str
    env: dict[str, str]
    timeout: float
    memory_limit: int
    max_processes: int
    report_fd: int
    uid: int | None = None
    gid: int | None = None


@dataclass
class Report:
    """How the call ended, written as one JSON line to the report fd.

    ``outcome`` is ``exited`` (the snippet ended by itself), ``timeout``, ``memory`` or
    ``processes`` (a limit was passed), ``stopped`` (the worker asked), ``orphaned``
    (the worker process is gone) or ``failed`` (the snippet could not be started).
    """

    outcome: str = "exited"
    exit_code: int | None = None
    peak_memory: int = 0
    peak_processes: int = 0
    reason: dict[str, Any] = field(default_factory=dict)


def measure(root: psutil.Process) -> tuple[int, int]:
    """The summed resident set size and the number of live processes below ``root``."""
    memory = count = 0
    for proc in root.children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            memory += proc.memory_info().rss
            count += 1
        except psutil.Error:
            continue
    return memory, count


def processes_of(uid: int) -> int:
    """How many processes the real user ``uid`` has now (``RLIMIT_NPROC`` counts them)."""
    count = 0
    for proc in psutil.process_iter():
        try:
            if proc.uids().real == uid:
                count += 1
        except psutil.Error:
            continue
    return count


def child_limits(config: Config) -> Callable[[], None]:
    """The rlimits the snippet starts with, applied in the child before exec."""
    uid = config.uid if config.uid is not None else os.getuid()
    # RLIMIT_NPROC counts every process of the user (root is exempt): a backstop that
    # stops a fork bomb faster than the poll can: twice the call's limit above the
    # processes the user has now, so the poll normally sees the limit passed first.
    nproc = processes_of(uid) + 2 * config.max_processes if uid != 0 else None

    def apply() -> None:
        memory = config.memory_limit
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def _start_snippet(config: Config) -> subprocess.Popen[bytes]:
    drop = config.uid is not None and config.uid != os.geteuid()
    return subprocess.Popen(
        [config.python, "-I", config.script],
        stdin=subprocess.DEVNULL,
        cwd=config.cwd,
        env=config.env,
        close_fds=True,
        start_new_session=True,
        user=config.uid if drop else None,
        group=config.gid if drop else None,
        extra_groups=[] if drop else None,
        preexec_fn=child_limits(config),
    )


def supervise(config: Config) -> Report:
    """Run the snippet of ``config`` to its end and leave no process of it behind."""
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    parent = os.getppid()
    report = Report()
    me = psutil.Process()
    try:
        snippet = _start_snippet(config)
    except OSError as exc:
        return Report(outcome="failed", reason={"error": f"{type(exc).__name__}: {exc}"})
    deadline = time.monotonic() + config.timeout
    try:
        while True:
            reaped = reap_children()
            if snippet.pid in reaped:
                report.exit_code = reaped[snippet.pid]
                break
            memory, count = measure(me)
            report.peak_memory = max(report.peak_memory, memory)
            report.peak_processes = max(report.peak_processes, count)
            if memory > config.memory_limit:
                report.outcome = "memory"
                report.reason = {"memory": memory}
                break
            if count > config.max_processes:
                report.outcome = "processes"
                report.reason = {"processes": count}
                break
            if time.monotonic() >= deadline:
                report.outcome = "timeout"
                break
            if stop:
                report.outcome = "stopped"
                break
            if os.getppid() != parent:
                report.outcome = "orphaned"
                break
            time.sleep(POLL_INTERVAL)
    finally:
        reaped = kill_tree()
        if report.exit_code is None and snippet.pid in reaped:
            report.exit_code = reaped[snippet.pid]
        snippet.returncode = report.exit_code  # reaped here, not by Popen
    return report


def main(argv: list[str]) -> int:
    """Entry point: ``python -s -P supervisor.py CONFIG_JSON``."""
    make_undumpable()
    set_child_subreaper()
    config = Config(**json.loads(argv[1]))
    report = supervise(config)
    with os.fdopen(config.report_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(asdict(report)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
