"""Scenarios c and e: sustained throughput, and how it scales with worker processes.

Throughput (c) is closed-loop at one concurrency level for every contender, so they are
compared like for like: K async agent runs, each calling ``echo`` once per turn until a
time window ends, against K threads each doing raw ``send_task("tools.echo")`` +
``get()`` through the same workers, and K local runs (the agent loop's own ceiling).

Scale (e) adds worker processes of a fixed small pool to one namespace and times the
same async fan-out of a sleep-bound tool on 1, 2 and 4 of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.bench.agents import (
    Marks,
    Runner,
    Window,
    check_results,
    fleet_agent,
    local_agent,
    looping_model,
    one_turn_model,
    tool_messages,
)
from orchestrator.bench.fleet import BenchFleet
from orchestrator.bench.latency import celery_round_trip
from orchestrator.bench.measure import summarise
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from tool_workers.contract.settings import Settings

ECHO = ("echo", {"text": "hi"})


Sample = tuple[int, float, float]
"""Calls completed, wall seconds, orchestrator CPU seconds."""


def _agent_slice(runner: Runner, agent: Any, window: Window, runs: int, duration: float) -> Sample:
    window.end = time.perf_counter() + duration
    c0, t0 = time.process_time(), time.perf_counter()
    states = runner.gather([agent] * runs, timeout=duration + 120)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    calls = sum(len(tool_messages(s)) for s in states)
    failed = sum(1 for s in states for m in tool_messages(s) if m.status != "success")
    if failed:
        raise RuntimeError(f"{failed} of {calls} throughput calls failed")
    return calls, elapsed, cpu


def _raw_slice(dispatcher: CeleryDispatcher, clients: int, duration: float) -> Sample:
    counts = [0] * clients
    errors: list[BaseException] = []
    end = time.perf_counter() + duration

    def client(index: int) -> None:
        try:
            while time.perf_counter() < end:
                celery_round_trip(dispatcher, "echo")
                counts[index] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    c0, t0 = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration + 60)
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"raw Celery client failed: {errors[0]!r}")
    return sum(counts), elapsed, time.process_time() - c0


def _rate(samples: list[Sample]) -> dict[str, float]:
    calls = sum(s[0] for s in samples)
    elapsed = sum(s[1] for s in samples)
    cpu = sum(s[2] for s in samples)
    return {
        "calls": calls,
        "seconds": elapsed,
        "per_second": calls / elapsed if elapsed > 0 else 0.0,
        "cpu_per_call": cpu / calls if calls else 0.0,
    }


def run_throughput(
    dispatcher: CeleryDispatcher, *, runs: int, duration: float, warmup: float, rounds: int
) -> dict[str, Any]:
    """Calls per second with ``runs`` concurrent clients, ``duration`` seconds each.

    The contenders take turns in ``rounds`` slices, so drift in the machine's other load
    falls on all of them alike.
    """
    runner = Runner()
    local_window, remote_window = Window(), Window()
    local = local_agent(looping_model(*ECHO, local_window))
    remote = fleet_agent(looping_model(*ECHO, remote_window), dispatcher)
    contenders: dict[str, Callable[[float], Sample]] = {
        "local": lambda d: _agent_slice(runner, local, local_window, runs, d),
        "toolfleet": lambda d: _agent_slice(runner, remote, remote_window, runs, d),
        "celery_raw": lambda d: _raw_slice(dispatcher, runs, d),
    }
    samples: dict[str, list[Sample]] = {name: [] for name in contenders}
    try:
        for measure in contenders.values():
            measure(warmup)
        for _ in range(rounds):
            for name, measure in contenders.items():
                samples[name].append(measure(duration / rounds))
    finally:
        runner.close()
    rates = {name: _rate(values) for name, values in samples.items()}
    raw = rates["celery_raw"]["per_second"]
    return {
        "runs": runs,
        **rates,
        "ratio": rates["toolfleet"]["per_second"] / raw if raw else 0.0,
    }


def run_scale(
    fleet: BenchFleet,
    settings: Settings,
    *,
    counts: Sequence[int],
    concurrency: int,
    calls: int,
    seconds: float,
    repeats: int,
) -> dict[str, Any]:
    """Throughput of one async fan-out of ``calls`` sleep calls on each worker count."""
    runner = Runner()
    started: list[Any] = []
    points: list[dict[str, Any]] = []
    try:
        for count in counts:
            started += fleet.start_workers(settings, count - len(started), concurrency=concurrency)
            dispatcher = fleet.dispatcher(settings)
            warm = fleet_agent(
                one_turn_model([("sleep", {"seconds": 0})] * count * concurrency), dispatcher
            )
            check_results(runner.run(warm, "async"), count * concurrency)
            marks = Marks()
            agent = fleet_agent(
                one_turn_model([("sleep", {"seconds": seconds})] * calls, marks), dispatcher
            )
            phases = []
            for _ in range(repeats):
                marks.clear()
                check_results(runner.run(agent, "async"), calls)
                phases.append(marks.tool_phase())
            phase = summarise(phases)
            points.append(
                {
                    "workers": count,
                    "tool_phase": phase,
                    "per_second": calls / phase["median"],
                    "ideal_per_second": count * concurrency / seconds,
                }
            )
    finally:
        runner.close()
        fleet.stop_workers(started)
    base = points[0]["per_second"] if points else 0.0
    for point in points:
        point["ratio"] = point["per_second"] / base if base else 0.0
    return {"concurrency": concurrency, "calls": calls, "seconds": seconds, "points": points}
