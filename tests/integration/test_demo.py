"""``toolfleet demo`` on this machine: embedded server, two workers, one agent run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.fleet import REPO

pytestmark = pytest.mark.timeout(180)


def test_demo_fans_out_across_two_worker_kinds_and_cleans_up() -> None:
    """Given no services and no API key, when `toolfleet demo` runs, then it says it uses
    the scripted model, the built-in tools' calls run on both built-in workers and the
    project's tool on its own kind of worker (all three on the queue "tools"), the answer
    is printed, and no process it started is left."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["COLUMNS"] = "200"
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )

    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "scripted model" in out
    ran = re.findall(r"<- (\w+)\s+((?:builtins|inventory)-\d@\S+)", out)
    assert {w for tool, w in ran if tool != "stock_level"} == {
        w for _, w in ran if w.startswith("builtins-")
    }
    assert len({w for _, w in ran if w.startswith("builtins-")}) == 2, out
    assert [w.split("@")[0] for tool, w in ran if tool == "stock_level"] == ["inventory-1"]
    assert "The inventory service reports 120 bolt in north." in out
    assert "TODOs are open" in out
    assert "stopped the workers and the embedded server" in out
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\) ready", out)]
    assert len(pids) == 3
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} still running"
