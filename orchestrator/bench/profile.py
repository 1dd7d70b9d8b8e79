"""Profile one benchmark workload with py-spy and print its hotspots.

A developer tool (``pip install py-spy``; root or ptrace rights needed), not part of
``toolfleet bench``. It starts a fleet as the benchmark does, warms the workload up,
then has py-spy sample this process (or the worker) while the workload repeats, and
prints the functions where the samples fall, by self and by inclusive time::

    python -m orchestrator.bench.profile latency-sync --seconds 15
    python -m orchestrator.bench.profile fanout-async --n 500 --target worker
    python -m orchestrator.bench.profile fanout-async --target worker --pool prefork \
        --concurrency 4 --tool echo --n 200

Workloads: ``latency-sync``, ``latency-async`` (one ``echo`` call, whole agent run),
``fanout-sync``, ``fanout-async`` (N calls of ``sleep(0.5 s)`` in one AIMessage, or of
``echo`` with ``--tool echo``). With ``--pool prefork`` and ``--target worker`` the
worker's pool processes are sampled beside its main process (scenario g's setup).
Samples are of threads on CPU (py-spy leaves idle threads out), so percentages are of
the CPU the target spent, across all its threads.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.bench.agents import Runner, check_results, fleet_agent, one_turn_model
from orchestrator.bench.fleet import BenchFleet

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


def _key(frame: str, lines: dict[str, collections.Counter[str]], count: int) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match["file"].split("site-packages/")[-1].split("/work/main/")[-1]
    key = f"{match['func']} ({path})"
    lines[key][match["line"] or "?"] += count
    return key


def summarise(raw: Path, top: int, ours: tuple[str, ...] = ("orchestrator/",)) -> str:
    """Self and inclusive shares of the hottest functions in a py-spy raw profile, then
    the inclusive shares of this project's functions with their main callees."""
    total = 0
    self_count: collections.Counter[str] = collections.Counter()
    incl_count: collections.Counter[str] = collections.Counter()
    callees: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    lines: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for row in raw.read_text().splitlines():
        stack, _, count_text = row.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if not f.startswith(("thread ", "process "))]
        keys = [_key(frame, lines, count) for frame in frames]
        for key in set(keys):
            incl_count[key] += count
        for caller, callee in set(itertools.pairwise(keys)):
            callees[caller][callee] += count
        if keys:
            self_count[keys[-1]] += count

    def pct(count: int) -> str:
        return f"{100 * count / max(total, 1):5.1f}%"

    def line_of(key: str) -> str:
        return lines[key].most_common(1)[0][0] if lines[key] else "?"

    out = [f"{total} samples (threads holding the GIL)"]
    for title, counter in (("self", self_count), ("inclusive", incl_count)):
        out.append(f"\n-- top {top} by {title} time --")
        for key, count in counter.most_common(top):
            out.append(f"{pct(count)}  {key} [hottest line {line_of(key)}]")
    out.append(f"\n-- {', '.join(ours)} functions by inclusive time, with their main callees --")
    mine = [(k, c) for k, c in incl_count.most_common() if any(o in k for o in ours)]
    for key, count in mine[:top]:
        out.append(f"{pct(count)}  {key} [hottest line {line_of(key)}]")
        for callee, sub in callees[key].most_common(4):
            out.append(f"          {pct(sub)}  -> {callee}")
    return "\n".join(out)


def _py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workload", choices=["latency-sync", "latency-async", "fanout-sync", "fanout-async"]
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="how long py-spy samples")
    parser.add_argument("--n", type=int, default=500, help="calls per fan-out")
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--target", choices=["orchestrator", "worker"], default="orchestrator")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--pool",
        choices=["threads", "prefork"],
        default="threads",
        help="the worker's pool (prefork: its pool processes are sampled too)",
    )
    parser.add_argument(
        "--tool",
        choices=["sleep", "echo"],
        default="sleep",
        help="what a fan-out calls (echo: scenario g's call, no wait)",
    )
    parser.add_argument("--concurrency", type=int, default=600)
    parser.add_argument("--out", type=Path, help="keep the raw py-spy profile here")
    args = parser.parse_args()

    mode = args.workload.split("-")[1]
    with tempfile.TemporaryDirectory() as tmp, BenchFleet(Path(tmp)) as fleet:
        settings = fleet.settings("profile")
        workers = fleet.start_workers(
            settings, args.workers, pool=args.pool, concurrency=args.concurrency
        )
        dispatcher = fleet.dispatcher(settings)
        calls: list[tuple[str, dict[str, Any]]]
        if args.workload.startswith("latency"):
            calls, expected = [("echo", {"text": "hi"})], 1
        else:
            call = ("echo", {"text": "hi"}) if args.tool == "echo" else ("sleep", {"seconds": 0.5})
            calls, expected = [call] * args.n, args.n
        agent = fleet_agent(one_turn_model(calls), dispatcher)
        runner = Runner()
        for _ in range(3):
            check_results(runner.run(agent, mode), expected)

        pid = workers[0].pid if args.target == "worker" else os.getpid()
        raw = args.out or Path(tmp) / "profile.txt"
        command = [_py_spy(), "record", "--pid", str(pid), "--duration", str(int(args.seconds))]
        command += ["--rate", str(args.rate), "--format", "raw", "--threads", "--gil"]
        if args.target == "worker" and args.pool == "prefork":
            command.append("--subprocesses")
        spy = subprocess.Popen([*command, "--output", str(raw)], stdout=subprocess.DEVNULL)
        done = threading.Event()

        def watch_spy() -> None:
            spy.wait()
            done.set()

        threading.Thread(target=watch_spy, daemon=True).start()
        runs, t0 = 0, time.perf_counter()
        while not done.is_set() and time.perf_counter() - t0 < args.seconds + 30:
            check_results(runner.run(agent, mode), expected)
            runs += 1
        spy.wait(timeout=60)
        runner.close()
        print(f"{args.workload} ({args.target}), {runs} runs while sampling")
        ours = ("tool_workers/",) if args.target == "worker" else ("orchestrator/",)
        print(summarise(raw, args.top, ours))
    return 0


if __name__ == "__main__":
    sys.exit(main())
