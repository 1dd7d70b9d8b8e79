"""The orchestrator dies mid-fan-out and a new process resumes the thread."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import FAULT_POLICY, REPO, call_states, effects, started_calls
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def orchestrator(mode: str, settings: Settings, db: Path, thread: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "tests.faults.orchestrator_proc", mode,
            settings.broker_url, settings.namespace, str(FAULT_POLICY), str(db), thread,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_killed_orchestrator_resumes_without_rerunning_calls(
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
    tmp_path: Path,
) -> None:
    """Given a fan-out of 5 calls (2 quick, 3 slow) on a checkpointed thread, when the
    orchestrator is SIGKILLed after the quick ones finished and while the slow ones run,
    and a new process resumes the thread, then the run completes and every call ran
    exactly once: finished results are reused, in-flight calls are re-attached."""
    settings = fault_settings()
    start_worker(settings, pool="threads", concurrency=8)
    db = tmp_path / "checkpoints.sqlite"

    first = orchestrator("start", settings, db, "crash-thread")
    deadline = time.monotonic() + 30
    # The quick calls are done, the slow ones still run.
    while call_states(settings)["SUCCESS"] < 2 or len(effects(counter, settings, "touch")) < 5:
        assert time.monotonic() < deadline, first.communicate(timeout=5)
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    # Three calls started and not finished: running.
    assert started_calls(settings) - call_states(settings)["SUCCESS"] == 3
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)

    second = orchestrator("resume", settings, db, "crash-thread")
    out, err = second.communicate(timeout=60)

    assert second.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["last"] == "done"
    assert sorted(result["tool_messages"]) == sorted(f"touched c{i} (run 1)" for i in range(5))
    assert list(effects(counter, settings, "touch").values()) == [1] * 5
