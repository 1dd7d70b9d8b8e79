"""``run_python``: run a model's Python snippet in a fresh, resource-limited subprocess.

Each call starts ``sys.executable -I`` on the snippet in a new, empty temporary working
directory and a new session (so a timeout can kill everything the snippet started), with
a wall-clock timeout, an address-space limit (``RLIMIT_AS``) and a minimal environment
(the worker's variables, such as broker passwords and API keys, are not passed on).
stdout and stderr are captured and capped.

This is NOT a security sandbox: the snippet runs as the worker's user, can read and write
whatever that user can, and can open network connections. It keeps honest mistakes (an
endless loop, a runaway allocation) from harming the worker; isolate untrusted code with a
container or VM around the ``sandbox`` queue's workers.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

__all__ = ["sandbox_tools"]

DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024
DEFAULT_MAX_TIMEOUT = 60.0
DEFAULT_OUTPUT_LIMIT = 20_000
# Once the process group is killed, how long to drain pipes still held open by a process
# that left the group (setsid) before giving up on its output.
_DRAIN_GRACE = 1.0
_POLL = 0.1


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


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(pgid, signal.SIGKILL)


def _collect(
    proc: subprocess.Popen[bytes], timeout: float, output_limit: int
) -> tuple[_CappedBuffer, _CappedBuffer, bool]:
    """Read stdout and stderr until the process ends or ``timeout`` passes.

    Reading both pipes as they fill (rather than ``communicate``) keeps memory bounded by
    ``output_limit`` however much the snippet prints.

    Returns:
        The captured stdout, stderr, and whether the timeout killed the process group.
    """
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): _CappedBuffer(output_limit)}
    buffers[proc.stderr.fileno()] = _CappedBuffer(output_limit)
    deadline = time.monotonic() + timeout
    timed_out = killed = False
    with selectors.DefaultSelector() as sel:
        for fd in buffers:
            sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            exited = proc.poll() is not None
            if exited and not sel.get_map():
                break
            if exited and not killed:
                # The snippet is done; background processes it left would hold the pipes.
                _kill_group(proc.pid)
                killed = True
                deadline = min(deadline, now + _DRAIN_GRACE)
            if now >= deadline:
                if killed:
                    break
                timed_out = killed = True
                _kill_group(proc.pid)
                deadline = now + _DRAIN_GRACE
                continue
            if not sel.get_map():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(deadline - now)
                continue
            for key, _ in sel.select(min(deadline - now, _POLL)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    buffers[key.fd].add(chunk)
                else:
                    sel.unregister(key.fd)
    return buffers[proc.stdout.fileno()], buffers[proc.stderr.fileno()], timed_out


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code: {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"exit code: {code} (killed by {name})"


def sandbox_tools(
    *,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> list[BaseTool]:
    """Build the ``run_python`` tool.

    Args:
        memory_limit_bytes: Address-space limit of the snippet's process (``RLIMIT_AS``).
        max_timeout: Longest wall-clock timeout a call may ask for, in seconds.
        output_limit: Bytes of stdout and of stderr kept; the rest is counted and dropped.

    Returns:
        A one-element list holding ``run_python``.

    Raises:
        ValueError: a limit is not positive.
    """
    if memory_limit_bytes <= 0 or max_timeout <= 0 or output_limit <= 0:
        raise ValueError("sandbox limits must be positive")

    def limit_child() -> None:
        # Runs in the child between fork and exec, so only the snippet is limited.
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        # A snippet hitting the memory limit may crash; a core dump would only fill disk.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    class RunPythonArgs(BaseModel):
        code: str = Field(description="Python 3 source to run as a script.")
        timeout: float = Field(
            default=min(10.0, max_timeout),
            gt=0,
            description=f"Wall-clock seconds before the run is killed (at most {max_timeout:g}).",
        )

    def run_python(code: str, timeout: float = 10.0) -> str:
        effective = min(timeout, max_timeout)
        with tempfile.TemporaryDirectory(
            prefix="toolfleet-run-python-", ignore_cleanup_errors=True
        ) as tmp:
            # The script sits beside, not in, the working directory the snippet sees.
            script = Path(tmp, "snippet.py")
            script.write_text(code, encoding="utf-8")
            workdir = Path(tmp, "work")
            workdir.mkdir()
            env = {
                "PATH": os.environ.get("PATH", os.defpath),
                "HOME": str(workdir),
                "TMPDIR": str(workdir),
                "LANG": "C.UTF-8",
            }
            with subprocess.Popen(
                [sys.executable, "-I", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=limit_child,
            ) as proc:
                try:
                    stdout, stderr, timed_out = _collect(proc, effective, output_limit)
                finally:
                    # Also reached when Celery's soft time limit interrupts the wait.
                    _kill_group(proc.pid)
        parts = []
        if timed_out:
            capped = f" (capped from {timeout:g} s)" if timeout > max_timeout else ""
            parts.append(
                f"timed out after {effective:g} s{capped}: the process and everything it "
                "started were killed"
            )
        parts += [
            _describe_exit(proc.returncode),
            f"--- stdout ---\n{stdout.text()}",
            f"--- stderr ---\n{stderr.text()}",
        ]
        return "\n".join(parts)

    return [
        StructuredTool.from_function(
            run_python,
            name="run_python",
            description="Run a Python 3 script in a fresh process and an empty temporary "
            "directory, and return its exit code, stdout and stderr. Nothing persists "
            f"between calls. Memory is limited to {memory_limit_bytes // 2**20} MiB; "
            f"output beyond {output_limit} bytes per stream is dropped. Print what you "
            "want to see.",
            args_schema=RunPythonArgs,
        )
    ]
