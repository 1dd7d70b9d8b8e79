"""Scenario b: a fan-out of N calls of ``sleep`` in one AIMessage, and what publishing costs.

The tool phase is timed by the scripted model itself: from the moment it hands out the
AIMessage with the N calls to the moment it is called again with their ToolMessages.
Its ideal is the tool's own duration. Sync runs (``invoke``) pass no run config: LangGraph
runs their Send tasks on its default pool, and the calls go out ahead of their hooks
(:mod:`orchestrator.dispatch.ahead`); async runs use ``ainvoke``.

Each fan-out is paired with the same fan-out of ``echo`` in a local ``ToolNode`` (what
LangGraph's own Send fan-out costs), and the CPU the run took is split between the
orchestrator, the workers and the server.

Dispatch cost is the orchestrator's time to put N prepared calls on the broker:
``CeleryDispatcher.submit(calls)`` for sync runs, and for async runs the time from the
first ``submit_async`` of one loop turn until the whole batch is published.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.bench.agents import (
    Marks,
    Runner,
    check_results,
    fleet_agent,
    local_agent,
    one_turn_model,
)
from orchestrator.bench.measure import summarise
from orchestrator.call import PreparedCall
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from tool_workers.contract.names import task_id_for

FANOUT_MODES = ("sync", "async")


def run_fanout(
    dispatcher: CeleryDispatcher,
    *,
    sizes: Sequence[int],
    seconds: float,
    repeats: int,
    budget: float,
    cpu_times: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Time the tool phase of one fan-out of each size, ``repeats`` times per mode.

    Next to each toolfleet run, the same fan-out of ``echo`` in a local ``ToolNode``
    measures what LangGraph's own fan-out of N costs. ``cpu_times`` (CPU seconds used so
    far by orchestrator, workers and server) splits each run's CPU between them.

    Sizes are measured smallest first; a size is skipped once ``budget`` seconds have
    passed (its entry then has ``count`` 0).
    """
    runner = Runner()
    deadline = time.monotonic() + budget
    points: list[dict[str, Any]] = []
    try:
        warm = fleet_agent(one_turn_model([("sleep", {"seconds": 0})] * 10), dispatcher)
        for mode in FANOUT_MODES:
            check_results(runner.run(warm, mode), 10)
        for n in sizes:
            marks, local_marks = Marks(), Marks()
            agent = fleet_agent(
                one_turn_model([("sleep", {"seconds": seconds})] * n, marks), dispatcher
            )
            local = local_agent(one_turn_model([("echo", {"text": "hi"})] * n, local_marks))
            phases: dict[str, list[float]] = {mode: [] for mode in FANOUT_MODES}
            local_phases: dict[str, list[float]] = {mode: [] for mode in FANOUT_MODES}
            cpu: dict[str, dict[str, list[float]]] = {mode: {} for mode in FANOUT_MODES}
            for _ in range(repeats):
                if time.monotonic() > deadline:
                    break
                for mode in FANOUT_MODES:
                    marks.clear()
                    before = cpu_times() if cpu_times else {}
                    check_results(runner.run(agent, mode), n)
                    after = cpu_times() if cpu_times else {}
                    phases[mode].append(marks.tool_phase())
                    for group, used in after.items():
                        cpu[mode].setdefault(group, []).append(used - before[group])
                    local_marks.clear()
                    check_results(runner.run(local, mode), n)
                    local_phases[mode].append(local_marks.tool_phase())
            for mode in FANOUT_MODES:
                points.append(
                    {
                        "n": n,
                        "mode": mode,
                        "tool_phase": summarise(phases[mode]),
                        "local_echo_phase": summarise(local_phases[mode]),
                        "cpu": {g: summarise(v)["median"] for g, v in cpu[mode].items()},
                    }
                )
    finally:
        runner.close()
    return {"seconds": seconds, "points": points}


def _prepared(dispatcher: CeleryDispatcher, n: int) -> list[PreparedCall]:
    spec = dispatcher.served_tools()["echo"]
    batch = uuid.uuid4().hex
    return [
        PreparedCall(
            tool="echo",
            call_id=f"call_{i}",
            args={"text": "hi"},
            task_id=task_id_for(f"bench-dispatch\x1f{batch}\x1f{i}"),
            queue=spec.queue,
            spec=spec,
        )
        for i in range(n)
    ]


def run_dispatch_cost(dispatcher: CeleryDispatcher, *, n: int, repeats: int) -> dict[str, Any]:
    """Wall and CPU time to publish ``n`` prepared calls, sync and async.

    CPU time is the whole process's (``time.process_time``), so it includes the result
    listener's subscription work that the publish triggers while it runs.
    """
    wall: dict[str, list[float]] = {"sync": [], "async": []}
    cpu: dict[str, list[float]] = {"sync": [], "async": []}
    loop = asyncio.new_event_loop()
    try:
        for _ in range(repeats):
            calls = _prepared(dispatcher, n)
            c0, t0 = time.process_time(), time.perf_counter()
            dispatcher.submit(calls)
            wall["sync"].append(time.perf_counter() - t0)
            cpu["sync"].append(time.process_time() - c0)
            for call in calls:
                dispatcher.wait(call, timeout=60)

            calls = _prepared(dispatcher, n)

            async def publish(batch: list[PreparedCall] = calls) -> None:
                await asyncio.gather(*(dispatcher.submit_async(c) for c in batch))

            c0, t0 = time.process_time(), time.perf_counter()
            loop.run_until_complete(publish())
            wall["async"].append(time.perf_counter() - t0)
            cpu["async"].append(time.process_time() - c0)
            for call in calls:
                dispatcher.wait(call, timeout=60)
    finally:
        loop.close()
    return {
        "n": n,
        "wall": {mode: summarise(values) for mode, values in wall.items()},
        "cpu": {mode: summarise(values) for mode, values in cpu.items()},
    }
