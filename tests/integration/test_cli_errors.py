"""The ``toolfleet`` command's errors: a line or two and a non-zero exit, never a traceback.

Run as a user runs it: the installed console script (whose import path starts at its own
folder, not the working directory), in a subprocess.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

TOOLFLEET = str(Path(sys.executable).parent / "toolfleet")
PASSWORD = "s3cret-pw"


def _closed_port() -> int:
    # A port nothing listens on: bound, then released.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toolfleet(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return subprocess.run(
        [TOOLFLEET, *args],
        cwd=cwd,
        env={**base, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def _assert_short_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    text = result.stdout + result.stderr
    assert result.returncode != 0, text
    assert "Traceback" not in text and "╭" not in text, text
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, text
    for needle in needles:
        assert needle in result.stderr, text


@pytest.mark.parametrize("command", [["status"], ["run", "hello", "--wait", "1"]])
def test_unreachable_broker_is_one_line_with_the_password_masked(
    tmp_path: Path, command: list[str]
) -> None:
    """Given a broker URL with a password where nothing listens, when status or run
    starts, then it prints one or two lines naming the URL with its password masked and
    exits non-zero."""
    port = _closed_port()
    result = _toolfleet(
        *command, cwd=tmp_path, TOOLFLEET_BROKER_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    )

    _assert_short_error(result, f"redis://:***@127.0.0.1:{port}/0")
    assert PASSWORD not in result.stdout + result.stderr


def _project(root: Path) -> None:
    (root / "myproj").mkdir()
    (root / "myproj" / "__init__.py").write_text("")
    (root / "myproj" / "models.py").write_text(
        "from orchestrator.sample import scripted_model\n\n\n"
        "def fn():\n    return scripted_model()\n"
    )


def test_run_finds_the_model_module_in_the_current_directory(tmp_path: Path) -> None:
    """Given a project directory holding myproj/models.py, when `toolfleet run --model
    myproj.models:fn` runs there, then the model is found: the run gets as far as the
    broker (unreachable here) and says so in a line."""
    _project(tmp_path)
    port = _closed_port()
    result = _toolfleet(
        "run",
        "hello",
        "--model",
        "myproj.models:fn",
        "--wait",
        "1",
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=f"redis://127.0.0.1:{port}/0",
    )

    _assert_short_error(result, f"127.0.0.1:{port}")
    assert "myproj" not in result.stderr


def test_run_with_a_model_that_cannot_be_imported_is_one_line(tmp_path: Path) -> None:
    """Given a model spec whose attribute does not exist, when `toolfleet run` starts,
    then it says so in a line before touching the fleet and exits non-zero."""
    _project(tmp_path)
    result = _toolfleet(
        "run",
        "hello",
        "--model",
        "myproj.models:missing",
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=f"redis://127.0.0.1:{_closed_port()}/0",
    )

    _assert_short_error(result, "myproj.models:missing")
