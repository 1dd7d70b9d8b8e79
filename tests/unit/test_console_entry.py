"""The ``toolfleet`` console script from its first moment: a Ctrl-C while the command is
still importing its CLI (typer, rich, the commands) exits 130 without a traceback, as one
later does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_WRAPPER = """
import importlib, importlib.abc, sys, time

class HoldTheCli(importlib.abc.MetaPathFinder):
    # The CLI's import, held: the moment a Ctrl-C meets it is then certain.
    def find_spec(self, name, path, target=None):
        if name == "orchestrator.cli":
            sys.meta_path.remove(self)
            print("importing the cli", flush=True)
            time.sleep(60)
        return None

sys.meta_path.insert(0, HoldTheCli())
module, _, attribute = sys.argv[1].partition(":")
# What the console script pip writes does: import the entry point, call it, exit.
entry = getattr(importlib.import_module(module), attribute)
sys.exit(entry())
"""


def _entry_point() -> str:
    """``[project.scripts] toolfleet`` of pyproject.toml (what an install's script runs)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return str(project["scripts"]["toolfleet"])


def test_ctrl_c_while_the_cli_is_imported_exits_130_without_a_traceback() -> None:
    """Given the console script's entry point, when Ctrl-C comes while it imports the
    CLI, then the command ends with exit code 130 and one line, no traceback."""
    process = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, _entry_point(), "--help"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT handled as in a terminal, whatever the test runner's own disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "importing the cli"
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip() == "interrupted", err
    assert process.returncode == 130, (process.returncode, err)


_FROZEN_AT_EXIT = """
import atexit, gc, sys

atexit.register(lambda: print("frozen", gc.get_freeze_count(), flush=True))
sys.argv = ["toolfleet", "bench", "--help"]
from orchestrator.cli import main

main()
"""


def test_a_finished_command_leaves_its_objects_to_the_exit_uncollected() -> None:
    """Given a `toolfleet` command that ends, when the interpreter exits, then every
    object the command made is frozen out of the collector: the exit's last collection
    does not walk them (with LangChain and a benchmark's results loaded, that walk kept
    the finished command waiting up to a second or more)."""
    done = subprocess.run(
        [sys.executable, "-c", _FROZEN_AT_EXIT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    frozen = int(done.stdout.strip().splitlines()[-1].removeprefix("frozen "))
    assert frozen > 0, done.stdout[-500:]
