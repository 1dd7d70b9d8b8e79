"""Interpreters and workers for the run_python tests on a machine where the tests run as
root: snippets then run as ``nobody``, who must be able to execute the interpreter, and
one worker runs as ``nobody`` itself."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import sysconfig
import tempfile
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
