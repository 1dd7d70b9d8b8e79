"""The benchmark's statistics: what `toolfleet bench` prints must be self-consistent."""

from __future__ import annotations

from orchestrator.bench.measure import added_latency, summarise


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
