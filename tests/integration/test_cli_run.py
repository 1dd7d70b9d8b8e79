"""`toolfleet run` against a fleet: formatted lines, the log's lines only when asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.local import settings_env
from tests.support.fleet import REPO
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)

TOOLFLEET = str(Path(sys.executable).parent / "toolfleet")


def _run(
    settings: Settings, *extra: str, prompt: str = "Survey the workspace"
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    base.pop("COLUMNS", None)  # as piped output is: no width given
    return subprocess.run(
        [TOOLFLEET, "run", prompt, *extra],
        cwd=REPO,
        env={**base, **settings_env(settings), "TOOLFLEET_LOG_JSON": "0"},
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_run_keeps_log_lines_out_unless_verbose(shared_fleet: Settings) -> None:
    """Given a fleet, when `toolfleet run` runs without --verbose, then each call appears
    once (its formatted line) and no INFO log line is printed; with --verbose the log's
    INFO lines are there too (on stderr). Piped, lines are not cut at 80 columns."""
    quiet = _run(shared_fleet)
    loud = _run(shared_fleet, "--verbose")

    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "<- grep" in quiet.stdout
    assert " INFO " not in quiet.stdout + quiet.stderr
    assert any(len(line) > 80 for line in quiet.stdout.splitlines()), quiet.stdout
    assert loud.returncode == 0, loud.stdout + loud.stderr
    assert " INFO toolfleet" in loud.stderr
    assert " INFO " not in loud.stdout


def test_prompts_answers_and_tool_output_are_text_not_markup(shared_fleet: Settings) -> None:
    """Given a prompt holding brackets (``[/oops]``, ``list[int]``, ``[error]``), when
    `toolfleet run` prints it, then it is printed as written: no markup error, nothing
    dropped."""
    prompt = "add [/oops] things: list[int], docs[/] and [error] [bold]x"

    result = _run(shared_fleet, prompt=prompt)

    assert result.returncode == 0, result.stdout + result.stderr
    assert prompt in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
