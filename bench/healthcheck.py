"""What one worker healthcheck costs: CPU time, peak memory and wall time per check.

A developer tool, not part of ``toolfleet bench``. It starts an embedded Redis and one
``celery -A tool_workers worker`` (the built-in toolset, or ``TOOLFLEET_TOOL_MODULES``
if set), then runs each healthcheck command several times and prints the median of
each measure: the compose file's ``python -m tool_workers.health <node>`` and the
``celery -A tool_workers inspect ping -d <node>`` it replaced (which imports every
tool module on every check)::

    python bench/healthcheck.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.local import EmbeddedRedis, WorkerProcess, settings_env
from tool_workers.contract.settings import Settings


def measure(command: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(CPU seconds, peak RSS in MB, wall seconds) of one run of ``command``."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command[:4]} failed: the worker is not healthy")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp)) as redis:
        settings = Settings(broker_url=redis.url, registry_refresh=1)
        env = {**os.environ, **settings_env(settings)}
        with WorkerProcess(settings, concurrency=1) as worker:
            worker.wait_ready()
            node = worker.hostname
            commands = {
                "python -m tool_workers.health": [
                    sys.executable, "-m", "tool_workers.health", node, "--timeout", "10",
                ],
                "celery -A tool_workers inspect ping": [
                    sys.executable, "-m", "celery", "-A", "tool_workers", "inspect", "ping",
                    "-d", node, "--timeout", "10",
                ],
            }  # fmt: skip
            print(f"{'healthcheck':<38} {'CPU s':>7} {'peak MB':>8} {'wall s':>7}")
            for name, command in commands.items():
                runs = [measure(command, env) for _ in range(args.runs)]
                cpu, rss, wall = (statistics.median(values) for values in zip(*runs, strict=True))
                print(f"{name:<38} {cpu:>7.2f} {rss:>8.0f} {wall:>7.2f}")


if __name__ == "__main__":
    main()
