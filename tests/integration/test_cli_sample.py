"""`toolfleet sample DIR`: the demo's sample project, so the output shown in
docs/http-service.md reproduces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sample import SAMPLE_PROJECT

pytestmark = pytest.mark.timeout(120)

TOOLFLEET = str(Path(sys.executable).parent / "toolfleet")


def test_sample_writes_the_demo_workspace_and_never_overwrites(tmp_path: Path) -> None:
    """Given an empty directory, when `toolfleet sample DIR` runs, then DIR holds the demo's
    sample project file for file; run again, it refuses in a line and changes nothing."""
    target = tmp_path / "workspace"

    first = subprocess.run([TOOLFLEET, "sample", str(target)], capture_output=True, text=True)
    (target / "notes.txt").write_text("mine\n")
    again = subprocess.run([TOOLFLEET, "sample", str(target)], capture_output=True, text=True)

    assert first.returncode == 0, first.stdout + first.stderr
    for relative, text in SAMPLE_PROJECT.items():
        if relative != "notes.txt":
            assert (target / relative).read_text() == text
    assert again.returncode == 2, again.stdout + again.stderr
    assert "Traceback" not in again.stderr
    assert "already exists" in again.stderr
    assert (target / "notes.txt").read_text() == "mine\n"
