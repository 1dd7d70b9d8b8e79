"""How ``toolfleet bench`` spends its first and last seconds.

Its workers boot (a Celery process importing LangChain takes seconds) while the
orchestrator imports its own agent stack, not after it; and once the report is out, the
idle workers are stopped at once: nothing is in flight, so their warm shutdown would
measure nothing and only keep the command waiting.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.bench.fleet import BenchFleet

REPO = Path(__file__).resolve().parents[2]

AGENT_STACK = ("langchain", "langgraph")
"""The agent stack (``create_agent`` and LangGraph's Pregel). ``langchain_core``'s
messages are not in it: the wire format the workers share imports them."""

_SPAWN_PROBE = """
import json, sys
from orchestrator.local import WorkerProcess

stack = {stack!r}
seen = []
spawn = WorkerProcess.start

def start(self):
    seen.append(sorted({{m.split(".")[0] for m in sys.modules}} & set(stack)))
    return spawn(self)

WorkerProcess.start = start
import orchestrator.bench.run as run
loaded_by_import = sorted({{m.split(".")[0] for m in sys.modules}} & set(stack))
plan = run.dataclasses.replace(run.QUICK, latency_iterations=1, latency_warmup=0)
report = run.run_bench(plan, quick=True, scenarios=["latency"])
print(json.dumps({{
    "import": loaded_by_import,
    "at_spawn": seen,
    "error": report["scenarios"]["latency"].get("error"),
}}))
"""


def test_bench_spawns_its_workers_before_it_imports_the_agent_stack() -> None:
    """Given `toolfleet bench`, when it starts, then importing its entry point loads no
    LangChain or LangGraph, and every worker process is spawned before they are loaded
    (the workers boot while the orchestrator imports), and the scenario still runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    done = subprocess.run(
        [sys.executable, "-c", _SPAWN_PROBE.format(stack=AGENT_STACK)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["error"] is None, probe
    assert probe["import"] == [], probe
    assert probe["at_spawn"], probe
    assert all(loaded == [] for loaded in probe["at_spawn"]), probe


def test_a_finished_run_stops_its_idle_workers_at_once(tmp_path: Path) -> None:
    """Given a bench fleet whose workers are up and idle, when the fleet closes at the end
    of a run, then each worker's session is killed at once, not waited on through a warm
    shutdown, and the server is stopped."""
    with BenchFleet(tmp_path) as fleet:
        workers = fleet.start_workers(fleet.settings("main"), 1, concurrency=4)
        server = fleet.server
        assert server is not None

    for worker in workers:
        assert worker.process is not None
        assert worker.process.returncode == -signal.SIGKILL, worker.process.returncode
    assert fleet.server is None and fleet.workers == []
