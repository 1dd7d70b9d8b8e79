"""Every toolfleet process keeps its secrets and its users' data to itself."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from orchestrator.agent import async_checkpointer, checkpointer
from tool_workers.contract.settings import Settings

SHOW_DUMPABLE = """
import sys
from orchestrator import cli
from tool_workers.contract.process import is_dumpable
sys.argv = ["toolfleet", "--help"]
try:
    cli.main()
except SystemExit:
    pass
print("dumpable" if is_dumpable() else "undumpable", file=sys.stderr)
"""


def test_every_toolfleet_command_is_not_dumpable() -> None:
    """Given the ``toolfleet`` entry point (serve and every other command go through it),
    when it runs, then its process is not dumpable: a process of the same user cannot
    read its environment or memory through /proc, nor ptrace it."""
    done = subprocess.run(
        [sys.executable, "-c", SHOW_DUMPABLE], capture_output=True, text=True, timeout=60
    )
    assert done.stderr.strip().splitlines()[-1] == "undumpable", done.stderr


def _modes(path: Path) -> dict[str, int]:
    return {
        p.name: stat.S_IMODE(p.stat().st_mode)
        for p in path.parent.iterdir()
        if p.name.startswith(path.name)
    }


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_checkpoint_files_are_readable_by_their_owner_alone(kind: str, tmp_path: Path) -> None:
    """Given the default SQLite checkpointer under the usual umask (022), when a
    checkpoint is written, then the database and its -wal and -shm files are 0600 (a
    snippet running as another user on the same host cannot read a conversation)."""
    path = tmp_path / "data" / "ckpt.sqlite"
    settings = Settings(checkpoint_path=path)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    old = os.umask(0o022)
    try:
        if kind == "sync":
            with checkpointer(settings) as saver:
                saver.put(config, empty_checkpoint(), {}, {})
                modes = _modes(path)
        else:

            async def write() -> dict[str, int]:
                async with async_checkpointer(settings) as saver:
                    await saver.aput(config, empty_checkpoint(), {}, {})
                    return await asyncio.to_thread(_modes, path)

            modes = asyncio.run(write())
    finally:
        os.umask(old)

    assert "ckpt.sqlite" in modes
    assert modes == {name: 0o600 for name in modes}, {k: oct(v) for k, v in modes.items()}


FLOWER_UMASK = """
import os, sys
sys.argv = ["celery", "-A", "tool_workers", "flower", "--persistent=True"]
import tool_workers.celery
print(oct(os.umask(0o022)))
"""


def test_flower_on_the_fleets_app_writes_its_files_for_its_user_alone() -> None:
    """Given Flower started on the fleet's app (as compose runs it, with a persistent
    database of tasks), then the files it creates are readable by its user alone."""
    done = subprocess.run(
        [sys.executable, "-c", FLOWER_UMASK],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")},
    )
    assert done.stdout.strip().splitlines()[-1] == "0o77", done.stderr[-2000:]
