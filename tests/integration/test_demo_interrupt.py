"""Ctrl-C in ``toolfleet demo``: the terminal signals the whole process group, at any moment.

Every moment must end the demo within a few seconds, with no traceback and no process of
the demo's (embedded server, workers, their pool children) left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.local import WorkerProcess
from tests.support.fleet import REPO
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(240)

# How long the whole demo may take to stop after Ctrl-C: generous on a loaded machine,
# far below the minutes it hung for when the server died first.
STOP_BOUND = 15.0


def _processes_under(tmp: Path) -> list[str]:
    """Live processes whose command line or environment mentions ``tmp``."""
    needle = str(tmp).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in text and state != "Z":
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()!r}")
    return found


def _interrupt_demo(tmp_path: Path, when: str, after: float) -> tuple[int, str, float]:
    """Run the demo as a terminal's foreground job; Ctrl-C ``after`` s past ``when``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(COLUMNS="200", PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "demo"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a job
        # SIGINT handled as in a terminal's foreground job, whatever this runner's own
        # disposition (a job started in the background of a script has it ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if when in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(120), "".join(lines)
        time.sleep(after)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    proc.stdout.close()
    return code, "".join(lines), took


@pytest.mark.parametrize(
    ("when", "after"),
    [
        ("embedded server", 0.0),  # the server is up, the workers are starting
        ("ready", 0.0),  # a worker is up
        ("  -> sleep", 0.0),  # the model has asked for its calls
        ("  -> sleep", 0.2),  # the calls are in flight on the workers
    ],
)
def test_ctrl_c_stops_the_demo_and_everything_it_started(
    tmp_path: Path, when: str, after: float
) -> None:
    """Given a running demo, when the terminal sends SIGINT to its process group, then the
    demo exits within STOP_BOUND seconds with code 130, prints no traceback, and no process
    it started is left."""
    code, out, took = _interrupt_demo(tmp_path, when, after)

    assert took < STOP_BOUND, f"took {took:.1f} s to stop:\n{out}"
    assert "Traceback" not in out, out
    assert "pub/sub connection lost" not in out, out
    assert code == 130, out
    assert "interrupted" in out, out
    deadline = time.monotonic() + 5
    while (left := _processes_under(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"{left}\n{out}"


def test_ctrl_c_while_a_worker_process_is_being_started_leaves_it_stoppable(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given Ctrl-C arriving while a worker's process is being created (after the fork,
    before ``Popen`` returns, the moment the demo hit when interrupted as its workers
    started), when the KeyboardInterrupt surfaces, then the worker knows its process,
    and stopping it leaves nothing running."""
    real_popen = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def popen_then_ctrl_c(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real_popen(*args, **kwargs)
        started.append(process)
        signal.raise_signal(signal.SIGINT)  # the handler runs before this call returns
        return process

    monkeypatch.setattr(subprocess, "Popen", popen_then_ctrl_c)
    worker = WorkerProcess(make_settings(), name="interrupted")
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.start()
        monkeypatch.undo()
        assert worker.process is started[0]
        worker.stop(grace=5)
        assert started[0].poll() is not None
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
