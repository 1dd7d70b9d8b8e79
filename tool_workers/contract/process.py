"""What every toolfleet process does to its own process and files: secrets out of reach.

A process of the same user (a ``run_python`` snippet on a non-root worker beside it, any
tool a worker runs) could otherwise read a toolfleet process's ``/proc/<pid>/environ``
(API tokens, the signing key, the broker password, model API keys) and ``mem``, or
ptrace it. Every toolfleet process marks itself non-dumpable at start (workers, ``toolfleet
serve`` and every other ``toolfleet`` command), and files holding users' data
(checkpoints) are created readable by their owner alone.

(run_python's supervisor sets the same mark with its own few lines: it runs as a program
on an interpreter that may have nothing of toolfleet installed.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3

PRIVATE_MODE = 0o600
"""The mode of files that hold users' data."""


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def make_undumpable() -> bool:
    """Mark this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``): its
    ``/proc/<pid>/environ``, ``mem`` and ``fd`` become root's, a process of the same user
    can no longer read them or ptrace it, and no core dump is written. Inherited across
    ``fork``; ``exec`` of a set-uid-free program by the same user resets it, so each
    toolfleet process calls this itself. Returns whether it took effect (``False`` off
    Linux)."""
    libc = _libc()
    if libc is None:
        return False
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(errno)}")
    return True


def is_dumpable() -> bool:
    """Whether this process is dumpable (always ``True`` off Linux)."""
    libc = _libc()
    return True if libc is None else bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))


def private_sqlite(path: Path) -> None:
    """Create the SQLite database ``path`` (and its folder) readable by its owner alone,
    and make an existing one and its ``-wal``/``-shm`` files so. SQLite creates the
    ``-wal`` and ``-shm`` files with the database file's mode, so they follow."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, PRIVATE_MODE)
    os.close(fd)
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            os.chmod(file, PRIVATE_MODE)
        except FileNotFoundError:
            continue
