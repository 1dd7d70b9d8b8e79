"""The benchmark's statistics: what `toolfleet bench` prints must be self-consistent."""

from __future__ import annotations

import threading

import pytest

from orchestrator.bench.measure import ScenarioTimeout, added_latency, bounded, summarise


def test_added_latency_p99_is_never_below_its_median() -> None:
    """Given rounds where the run without toolfleet has the heavier tail, when the added
    latency is summarised, then its p99 is at least its median (a difference of the two
    sides' p99s fell below the difference of their medians here)."""
    with_it = [5.0, 5.0, 5.0, 5.0]
    without = [1.0, 1.0, 1.0, 4.0]

    added = added_latency(with_it, without)

    assert added["median"] == 4.0
    assert added["p99"] >= added["median"]
    assert added["count"] == 4
    assert summarise(with_it)["p99"] - summarise(without)["p99"] < added["median"]


def test_given_a_scenario_past_its_bound_then_its_run_is_stopped_before_the_next_starts() -> None:
    """Given a scenario whose run outlives its time bound, when the bound passes, then
    the harness stops that run (a run left going in its thread kept publishing calls
    into the next scenarios' measurements) and says so in the timeout."""
    stopped = threading.Event()
    calls = 0

    def run() -> None:
        nonlocal calls
        while not stopped.is_set():
            calls += 1  # a call published
            stopped.wait(0.01)
        raise RuntimeError("cancelled")  # what a stopped dispatcher makes a run raise

    threads_before = set(threading.enumerate())
    with pytest.raises(ScenarioTimeout, match="stopped"):
        bounded(run, 0.2, "fanout", stop=stopped.set)

    assert stopped.is_set()
    published = calls
    # Its thread has ended (none of the test's is left): what it published is final.
    assert not [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert calls == published
