"""``run_python``: run a model's Python snippet in a fresh, supervised process tree.

Each call runs the snippet with ``python -I`` (isolated mode) in a new, empty temporary working
directory with a minimal environment, under a supervisor process of its own
(:mod:`tool_workers.builtin.supervisor`). stdout and stderr are captured and capped.

What is contained:

- **Credentials.** The worker's processes are non-dumpable (set at worker start), so a
  snippet cannot read their ``/proc/<pid>/environ`` or memory, nor ptrace them, even as
  the same user; the supervisor starts from a clean environment and is non-dumpable too.
  The snippet gets only ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG``, and no open file
  but its stdin (``/dev/null``), stdout and stderr. When the worker runs as root, the
  snippet runs as ``TOOLFLEET_SANDBOX_USER`` (``nobody`` by default, no supplementary
  groups), owner of its temporary directory, on ``TOOLFLEET_SANDBOX_PYTHON`` (the
  worker's interpreter by default, which that user must be able to execute).
- **Memory, per call.** The resident memory of all the call's processes together is
  checked every ~50 ms against ``TOOLFLEET_SANDBOX_MEMORY_LIMIT``; past it the whole tree
  is killed and the result says so. Each process also has that limit as its address
  space (``RLIMIT_AS``), so one allocation beyond it fails at once with MemoryError.
- **Processes, per call.** More than ``TOOLFLEET_SANDBOX_MAX_PROCESSES`` live processes
  in the tree kill it the same way; ``RLIMIT_NPROC`` (the user's current processes plus
  twice that number) stops a fast fork bomb in between, except for root.
- **Lifetime.** The supervisor is a child subreaper, so processes started in a session
  of their own or after a double fork stay in its tree. When the snippet exits, times
  out or passes a limit, when the worker's wait is interrupted (the soft time limit, an
  exception) or the pool process dies (the hard time limit), every descendant is
  SIGKILLed and reaped until none is left. Should the supervisor itself die, the pool
  process (a subreaper while the call runs) kills what it leaves.

This is NOT a security sandbox. Not contained: the file system (the snippet reads and
writes whatever its user may: with a non-root worker that is the worker's user, so files
readable by the worker, such as a mounted ``.env``, are readable by the snippet), the
network (it can connect anywhere the worker can, the broker included, though without
its password), CPU time within the timeout, disk space, and a same-user snippet may
still signal the worker's processes. Memory is summed as resident set size, so pages
shared between forked processes count once per process. Isolate untrusted code with a
container or VM around the ``sandbox`` queue's workers, as the compose deployment does.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from tool_workers.builtin import supervisor
from tool_workers.builtin.adoption import ADOPTION
from tool_workers.contract.errors import ConfigError

__all__ = ["sandbox_tools"]

DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024
DEFAULT_MAX_PROCESSES = 32
DEFAULT_USER = "nobody"
DEFAULT_MAX_TIMEOUT = 60.0
DEFAULT_OUTPUT_LIMIT = 20_000
# Beyond the call's own timeout: the supervisor's start and its killing of the tree.
_SUPERVISOR_GRACE = 15.0
# How long a supervisor asked to stop may take before it is killed itself.
_STOP_GRACE = 2.0
# Once the supervisor has exited, how long to drain pipes still held open by a process
# it left behind before that process is killed.
_DRAIN_GRACE = 1.0
_POLL = 0.1
_SUPERVISOR = Path(supervisor.__file__)
_PSUTIL_PATH = str(Path(psutil.__file__).resolve().parents[1])


class _CappedBuffer:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def text(self) -> str:
        out = self.data.decode("utf-8", errors="replace")
        if self.total > self.cap:
            out += f"\n[truncated: {self.total} bytes written, first {self.cap} shown]"
        return out


@dataclass(frozen=True)
class _Identity:
    """The uid and gid a snippet runs as (``None``: the worker's own)."""

    uid: int | None = None
    gid: int | None = None


def _sandbox_identity(user: str) -> _Identity:
    """The identity snippets run as: ``user`` when the worker runs as root, else the
    worker's own (an unprivileged process cannot change user).

    Raises:
        ConfigError: the worker runs as root and ``user`` does not exist.
    """
    if os.geteuid() != 0:
        return _Identity()
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise ConfigError(f"TOOLFLEET_SANDBOX_USER: no user {user!r} on this host") from None
    return _Identity(entry.pw_uid, entry.pw_gid)


def _read_streams(
    proc: subprocess.Popen[bytes], report_fd: int, deadline: float, output_limit: int
) -> tuple[_CappedBuffer, _CappedBuffer, bytes]:
    """Read the snippet's stdout and stderr and the supervisor's report until all are
    closed and the supervisor has exited, or ``deadline`` (monotonic) passes.

    Reading both pipes as they fill (rather than ``communicate``) keeps memory bounded by
    ``output_limit`` however much the snippet prints.
    """
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _CappedBuffer(output_limit), _CappedBuffer(output_limit)
    report = bytearray()
    sinks: dict[int, Callable[[bytes], None]] = {
        proc.stdout.fileno(): out.add,
        proc.stderr.fileno(): err.add,
        report_fd: report.extend,
    }
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                if not sel.get_map():
                    break
                deadline = min(deadline, now + _DRAIN_GRACE)
            if now >= deadline:
                break
            for key, _ in sel.select(min(deadline - now, _POLL)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    sinks[key.fd](chunk)
                else:
                    sel.unregister(key.fd)
    return out, err, bytes(report)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask the supervisor to end the call (it kills its tree), then make sure it is gone."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code: {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"exit code: {code} (killed by {name})"


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


@dataclass(frozen=True)
class _Limits:
    """A call's memory (bytes) and process limits, as the result quotes them."""

    memory: int
    processes: int


def _summary(report: dict[str, Any], effective: float, timeout: float, limits: _Limits) -> str:
    """The line saying why a call was stopped ('' when the snippet ended by itself)."""
    outcome = report.get("outcome", "lost")
    reason = report.get("reason") or {}
    killed = "the process and everything it started were killed"
    if outcome == "timeout":
        capped = f" (capped from {timeout:g} s)" if timeout > effective else ""
        return f"timed out after {effective:g} s{capped}: {killed}"
    if outcome == "memory":
        return (
            f"stopped at the memory limit: the call's processes used "
            f"{_mib(reason.get('memory', 0))} together, over the {_mib(limits.memory)} "
            f"a call may use; {killed}"
        )
    if outcome == "processes":
        return (
            f"stopped at the process limit: the call ran {reason.get('processes', 0)} "
            f"processes at once, over the {limits.processes} a call may run; {killed}"
        )
    if outcome in ("stopped", "orphaned", "lost"):
        return f"interrupted: {killed}"
    return ""


def sandbox_tools(
    *,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    user: str = DEFAULT_USER,
    python: str | None = None,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> list[BaseTool]:
    """Build the ``run_python`` tool.

    Args:
        memory_limit_bytes: Resident memory all of one call's processes may use together
            (also each process's ``RLIMIT_AS``).
        max_processes: Live processes one call may run at once.
        user: Name or uid snippets run as when the worker runs as root.
        python: Interpreter snippets run with (default: the worker's own); it must be
            executable by ``user``.
        max_timeout: Longest wall-clock timeout a call may ask for, in seconds.
        output_limit: Bytes of stdout and of stderr kept; the rest is counted and dropped.

    Returns:
        A one-element list holding ``run_python``.

    Raises:
        ValueError: a limit is not positive.
        ConfigError: the worker runs as root and ``user`` does not exist.
    """
    if min(memory_limit_bytes, max_processes, max_timeout, output_limit) <= 0:
        raise ValueError("sandbox limits must be positive")
    identity = _sandbox_identity(user)
    limits = _Limits(memory_limit_bytes, max_processes)

    class RunPythonArgs(BaseModel):
        code: str = Field(description="Python 3 source to run as a script.")
        timeout: float = Field(
            default=min(10.0, max_timeout),
            gt=0,
            description=f"Wall-clock seconds before the run is killed (at most {max_timeout:g}).",
        )

    def run_python(code: str, timeout: float = 10.0) -> str:
        effective = min(timeout, max_timeout)
        tmp = tempfile.mkdtemp(prefix="toolfleet-run-python-")
        try:
            report, stdout, stderr = _run(code, Path(tmp), effective)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if report.get("outcome") == "failed":
            raise RuntimeError(f"run_python could not start the snippet: {report['reason']}")
        parts = [line for line in [_summary(report, effective, timeout, limits)] if line]
        code_ = report.get("exit_code")
        parts += [
            _describe_exit(code_) if code_ is not None else "exit code: unknown",
            f"--- stdout ---\n{stdout.text()}",
            f"--- stderr ---\n{stderr.text()}",
        ]
        return "\n".join(parts)

    def _run(
        code: str, tmp: Path, effective: float
    ) -> tuple[dict[str, Any], _CappedBuffer, _CappedBuffer]:
        # The script sits beside, not in, the working directory the snippet sees.
        script = tmp / "snippet.py"
        script.write_text(code, encoding="utf-8")
        workdir = tmp / "work"
        workdir.mkdir()
        if identity.uid is not None:
            for path in (tmp, script, workdir):
                os.chown(path, identity.uid, identity.gid if identity.gid is not None else -1)
        read_fd, write_fd = os.pipe()
        config = supervisor.Config(
            python=python or sys.executable,
            script=str(script),
            cwd=str(workdir),
            env={
                "PATH": os.environ.get("PATH", os.defpath),
                "HOME": str(workdir),
                "TMPDIR": str(workdir),
                "LANG": "C.UTF-8",
            },
            timeout=effective,
            memory_limit=memory_limit_bytes,
            max_processes=max_processes,
            report_fd=write_fd,
            uid=identity.uid,
            gid=identity.gid,
        )
        started_at = time.time()
        proc: subprocess.Popen[bytes] | None = None
        report: dict[str, Any] = {"outcome": "lost"}
        ADOPTION.enter()
        try:
            arg = json.dumps(asdict(config))
            proc = subprocess.Popen(
                # Not -I: the supervisor imports psutil from where the worker found it
                # (PYTHONPATH below; the environment holds nothing else of the worker's).
                [sys.executable, "-s", "-P", str(_SUPERVISOR), arg],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                cwd=tmp,
                env={"PATH": config.env["PATH"], "LANG": "C.UTF-8", "PYTHONPATH": _PSUTIL_PATH},
                start_new_session=True,
            )
            ADOPTION.started(proc.pid)
            os.close(write_fd)
            write_fd = -1
            deadline = time.monotonic() + effective + _SUPERVISOR_GRACE
            stdout, stderr, raw = _read_streams(proc, read_fd, deadline, output_limit)
            with contextlib.suppress(ValueError):
                report = json.loads(raw)
        finally:
            # Also reached when Celery's soft time limit interrupts the wait.
            if proc is not None:
                _stop(proc)
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            clean = proc is not None and proc.returncode == 0 and report["outcome"] != "lost"
            ADOPTION.leave(proc.pid if proc else None, started_at, orphans=not clean)
        return report, stdout, stderr

    return [
        StructuredTool.from_function(
            run_python,
            name="run_python",
            description="Run a Python 3 script in a fresh process and an empty temporary "
            "directory, and return its exit code, stdout and stderr. Nothing persists "
            f"between calls. Memory is limited to {memory_limit_bytes // 2**20} MiB and "
            f"{max_processes} processes per call; output beyond {output_limit} bytes per "
            "stream is dropped. Print what you want to see.",
            args_schema=RunPythonArgs,
        )
    ]
