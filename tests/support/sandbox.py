"""Interpreters and workers for the run_python tests on a machine where the tests run as
root: snippets then run as ``nobody``, who must be able to execute the interpreter, and
one worker runs as ``nobody`` itself."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import pytest

from orchestrator.local import WorkerProcess

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


def _world_executable(path: Path) -> bool:
    real = path.resolve()
    dirs_ok = all(d.stat().st_mode & stat.S_IXOTH for d in real.parents)
    return dirs_ok and bool(real.stat().st_mode & stat.S_IXOTH)


def sandbox_python() -> str:
    """An interpreter of this Python version that any user may execute: this one when its
    path allows it, else the system's (a venv on a Python under /root does not)."""
    if _world_executable(Path(sys.executable)):
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system is None or not _world_executable(Path(system)):
        pytest.fail(f"no {version} executable by any user on this machine")
    return system


def nobody_dir() -> Path:
    """A fresh directory ``nobody`` owns (its workspace, metrics and temporary files)."""
    path = Path(tempfile.mkdtemp(prefix="tft-nobody-"))
    os.chown(path, NOBODY, NOBODY)
    return path


def _closed_ancestor(path: Path) -> Path | None:
    """The highest folder above ``path`` that other users cannot enter, if any."""
    closed = [d for d in path.parents if not d.stat().st_mode & stat.S_IXOTH]
    return closed[-1] if closed else None


def _reopen_script(paths: list[Path]) -> str:
    """Shell lines, run as root in a mount namespace of its own, after which every one of
    ``paths`` is reachable by any user at its own path: each folder above them that others
    cannot enter is covered by an empty world-enterable tmpfs, and the paths are
    bind-mounted back into it (from views made before the cover)."""
    covers = sorted({a for p in paths if (a := _closed_ancestor(p)) is not None})
    if not covers:
        return ""
    views = nobody_dir()
    lines = []
    kept = [p for p in paths if not any(p != q and q in p.parents for q in paths)]
    for i, path in enumerate(kept):
        (views / str(i)).mkdir()
        lines.append(f"mount --bind '{path}' '{views / str(i)}'")
    lines += [f"mount -t tmpfs -o mode=0755 toolfleet-test '{cover}'" for cover in covers]
    for i, path in enumerate(kept):
        lines += [f"mkdir -p '{path}'", f"mount --bind '{views / str(i)}' '{path}'"]
    return " && ".join(lines) + " && "


def as_nobody(argv: list[str], reach: list[Path], env: str = "") -> list[str]:
    """``argv`` run as ``nobody`` with no supplementary groups, in a mount namespace of
    its own where each of ``reach`` (and what it holds) is reachable at its own path.

    Args:
        argv: The command (its interpreter one ``nobody`` may execute).
        reach: Folders ``nobody`` must reach, such as the checkout and the venv's packages.
        env: ``NAME="value" ...`` assignments for the command, in shell syntax.
    """
    drop = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups"
    script = _reopen_script(reach) + f'{env} exec {drop} "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


class NobodyWorker(WorkerProcess):
    """A ``celery worker`` running as ``nobody`` (:func:`as_nobody`), on an interpreter
    ``nobody`` may execute, importing this checkout and its venv's packages through
    ``PYTHONPATH``. Both stay reachable at their own paths even under a folder ``nobody``
    cannot enter (a clone in root's home), so every path in the worker's settings holds.
    """

    def command(self) -> list[str]:
        site = Path(sysconfig.get_paths()["purelib"])
        argv = [sandbox_python(), *super().command()[1:]]
        return as_nobody(argv, [REPO, site], env=f'PYTHONPATH="{REPO}:{site}"')


class Beacon:
    """A TCP listener on 127.0.0.1 that snippets report to (the network is not isolated, so
    a report reaches the test from inside any namespace): each connection's bytes, in the
    order they arrived."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="beacon", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(4096):
                        data += chunk
            self.messages.append(data.decode(errors="replace"))

    def send_code(self, message: str) -> str:
        """Python lines that report ``message`` (an expression) to this beacon."""
        return (
            "import socket as _s\n"
            f"with _s.create_connection(('127.0.0.1', {self.port}), timeout=5) as _c:\n"
            f"    _c.sendall(str({message}).encode())\n"
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()


class NoSysAdminWorker(WorkerProcess):
    """A ``celery worker`` running as root without ``CAP_SYS_ADMIN`` (out of its bounding
    set), as in a container with the default capabilities: it cannot make mount or pid
    namespaces."""

    def command(self) -> list[str]:
        return [
            "setpriv",
            "--bounding-set=-sys_admin",
            "--inh-caps=-sys_admin",
            "--",
            *super().command(),
        ]


# Run by root: a user namespace mapping uids 0-65535 to themselves, where no further user
# namespace may be made (user.max_user_namespaces is per user namespace), then the command.
_NO_USERNS = """
import os, sys
CLONE_NEWUSER = 0x10000000
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ready_r, ready_w = os.pipe()
mapped_r, mapped_w = os.pipe()
pid = os.fork()
if pid == 0:
    if libc.unshare(CLONE_NEWUSER) != 0:
        os._exit(100)
    os.write(ready_w, b"x")
    os.read(mapped_r, 1)
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.execvp(sys.argv[1], sys.argv[1:])
import signal
signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
os.read(ready_r, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write("0 0 65536")
os.write(mapped_w, b"x")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


class NoUserNamespaceWorker(NobodyWorker):
    """A :class:`NobodyWorker` on a host where unprivileged user namespaces are off (here:
    in a user namespace whose ``user.max_user_namespaces`` is 0). Its pid is the helper's
    that waits for it and passes it SIGTERM."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", _NO_USERNS, *super().command()]
