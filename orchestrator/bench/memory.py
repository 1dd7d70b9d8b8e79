"""Scenario d: orchestrator memory per in-flight call, and nothing left behind.

One run fans out many calls of a tool that sleeps long enough for all of them to be in
flight at once. The orchestrator's resident set size (``/proc/self/statm``) is sampled
while every call is in flight (``dispatcher.in_flight()`` equals the fan-out) and
compared with the size just before the run: the growth per call is what the run's
futures, subscriptions, Send tasks and messages cost.

After all the runs of the benchmark, every dispatcher it used must be back to zero: no
call in flight, no result watched, no pub/sub subscription but the listener's idle one.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterable
from typing import Any

from orchestrator.bench.agents import (
    PAYLOAD,
    RUN_CONFIG,
    Runner,
    check_results,
    fleet_agent,
)
from orchestrator.bench.agents import one_turn_model as model_for
from orchestrator.bench.measure import rss_bytes
from orchestrator.dispatch.dispatcher import CeleryDispatcher


def _measure_one(
    dispatcher: CeleryDispatcher, mode: str, calls: int, seconds: float
) -> dict[str, Any]:
    agent = fleet_agent(model_for([("sleep", {"seconds": seconds})] * calls), dispatcher)
    warm = fleet_agent(model_for([("sleep", {"seconds": 0})] * max(1, calls // 10)), dispatcher)
    runner = Runner()
    try:
        check_results(runner.run(warm, mode), max(1, calls // 10))
    finally:
        runner.close()
    gc.collect()
    before = rss_bytes()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            if mode == "sync":
                outcome["state"] = agent.invoke(PAYLOAD, RUN_CONFIG)
            else:
                outcome["state"] = asyncio.run(agent.ainvoke(PAYLOAD, RUN_CONFIG))
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"bench-memory-{mode}", daemon=True)
    thread.start()
    peak_rss, peak_in_flight, samples = before, 0, 0
    while thread.is_alive():
        in_flight = dispatcher.in_flight()
        peak_in_flight = max(peak_in_flight, in_flight)
        if in_flight >= calls:
            peak_rss = max(peak_rss, rss_bytes())
            samples += 1
        thread.join(0.01)
    if "error" in outcome:
        raise outcome["error"]
    check_results(outcome["state"], calls)
    outcome.clear()
    gc.collect()
    after = rss_bytes()
    growth = peak_rss - before
    return {
        "calls": calls,
        "peak_in_flight": peak_in_flight,
        "samples_all_in_flight": samples,
        "rss_before_mib": before / 2**20,
        "rss_peak_mib": peak_rss / 2**20,
        "rss_after_mib": after / 2**20,
        "kib_per_call": growth / 1024 / calls,
    }


def run_memory(
    dispatcher: CeleryDispatcher, *, calls: int, seconds: float, modes: Iterable[str]
) -> dict[str, Any]:
    """RSS growth per in-flight call for a fan-out of ``calls`` sleep calls, per mode."""
    return {"modes": {mode: _measure_one(dispatcher, mode, calls, seconds) for mode in modes}}


def leaks(dispatchers: Iterable[CeleryDispatcher], settle: float = 5.0) -> dict[str, int]:
    """Calls in flight, results watched and channels subscribed, summed over dispatchers.

    Unsubscribing happens on the listener's thread after a call returns, so this waits up
    to ``settle`` seconds for the counts to reach zero before it reports them.
    """
    dispatchers = list(dispatchers)
    deadline = time.monotonic() + settle
    while True:
        counts = {
            "in_flight": sum(d.in_flight() for d in dispatchers),
            "pending": sum(d.listener.pending() for d in dispatchers),
            "subscriptions": sum(
                len(set(d.listener.subscribed) - {d.listener.reply_channel}) for d in dispatchers
            ),
        }
        if not any(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)
