"""Scenario g's arithmetic: server counters diffed, normalised per call, compared, judged."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.bench.cost import (
    Gang,
    Usage,
    command_calls,
    diff_counts,
    net_bytes,
    per_call,
    per_second,
    per_unit,
    ratio,
    top,
    versus,
)
from orchestrator.bench.report import markdown
from orchestrator.bench.targets import targets


def _info(calls: dict[str, int], net_in: int, net_out: int) -> dict[str, Any]:
    """A parsed ``INFO stats commandstats`` as redis-py returns it."""
    info: dict[str, Any] = {
        "total_net_input_bytes": net_in,
        "total_net_output_bytes": net_out,
        "total_commands_processed": sum(calls.values()),
    }
    for name, count in calls.items():
        info[f"cmdstat_{name}"] = {"calls": count, "usec": 3 * count, "usec_per_call": 3.0}
    return info


def test_command_calls_reads_cmdstat_entries_only() -> None:
    """Given INFO with stats and commandstats, when the command calls are read, then each
    ``cmdstat_<name>`` gives its calls (subcommands keep their name) and nothing else
    counts."""
    info = _info({"evalsha": 7, "client|setinfo": 2}, 100, 50)

    assert command_calls(info) == {"evalsha": 7, "client|setinfo": 2}
    assert net_bytes(info) == 150


def test_diff_counts_keeps_what_grew_and_new_commands() -> None:
    """Given two readings, when diffed, then unchanged commands are left out and a command
    first run between them counts from zero."""
    before = {"get": 10, "set": 5, "ping": 3}
    after = {"get": 14, "set": 5, "ping": 3, "evalsha": 2}

    assert diff_counts(after, before) == {"get": 4, "evalsha": 2}


def test_per_unit_divides_and_orders_largest_first() -> None:
    """Given counts over 1,000 calls, when normalised per call, then each is divided,
    rounded, and the largest comes first (ties by name); no units give nothing."""
    scaled = per_unit({"set": 2000, "evalsha": 1000, "get": 2000}, 1000)

    assert scaled == {"get": 2.0, "set": 2.0, "evalsha": 1.0}
    assert list(scaled) == ["get", "set", "evalsha"]
    assert per_unit({"get": 1}, 0) == {}
    assert list(top(scaled, 2)) == ["get", "set"]


def test_usages_add_up_across_rounds() -> None:
    """Given two windows of one contender, when added, then every counter is summed."""
    one = Usage(10, 1.0, {"get": 20}, 1000, {"orchestrator": 0.1, "server": 0.01})
    two = Usage(10, 3.0, {"get": 20, "set": 10}, 500, {"orchestrator": 0.3, "raw_workers": 0.2})

    total = one + two

    assert total.calls == 20 and total.seconds == 4.0 and total.net_bytes == 1500
    assert total.commands == {"get": 40, "set": 10}
    assert total.cpu == pytest.approx({"orchestrator": 0.4, "server": 0.01, "raw_workers": 0.2})


def test_per_call_takes_the_contenders_own_workers() -> None:
    """Given a window with both fleets' CPU, when normalised for raw Celery, then its
    workers' CPU is the raw fleet's and the total sums orchestrator, workers and server."""
    usage = Usage(
        calls=1000,
        seconds=2.0,
        commands={"evalsha": 1000, "set": 2000},
        net_bytes=5_000_000,
        cpu={"orchestrator": 1.0, "raw_workers": 2.0, "toolfleet_workers": 0.5, "server": 0.25},
    )

    numbers = per_call(usage, "raw_workers")

    assert numbers["calls_per_second"] == 500.0
    assert numbers["commands_per_call"] == 3.0
    assert numbers["commands_by_name_per_call"] == {"set": 2.0, "evalsha": 1.0}
    assert numbers["bytes_per_call"] == 5000.0
    assert numbers["cpu_ms_per_call"] == {
        "orchestrator": 1.0,
        "workers": 2.0,
        "server": 0.25,
        "total": 3.25,
    }
    with pytest.raises(ValueError):
        per_call(Usage(), "raw_workers")


def test_per_second_of_an_idle_window() -> None:
    """Given two idle seconds, when normalised, then everything is per second."""
    usage = Usage(0, 2.0, {"brpop": 4, "evalsha": 6}, 8000, {"server": 0.01, "orchestrator": 0.0})

    idle = per_second(usage)

    assert idle["commands_per_second"] == 5.0
    assert idle["commands_by_name_per_second"] == {"evalsha": 3.0, "brpop": 2.0}
    assert idle["bytes_per_second"] == 4000.0
    assert idle["cpu_ms_per_second"] == pytest.approx({"orchestrator": 0.0, "server": 5.0})


def _numbers(commands: float, net: float, rate: float, cpu: float) -> dict[str, Any]:
    return {
        "calls": 1000,
        "commands_per_call": commands,
        "commands_by_name_per_call": {"get": commands},
        "bytes_per_call": net,
        "calls_per_second": rate,
        "cpu_ms_per_call": {"orchestrator": cpu, "workers": cpu, "server": 0.0, "total": 2 * cpu},
    }


def test_versus_raw_differences_and_ratios() -> None:
    """Given toolfleet's and raw Celery's numbers, when compared, then commands are a
    difference, the rest ratios, and a ratio to zero is None (not infinity)."""
    raw = _numbers(18.0, 5000.0, 400.0, 2.0)
    toolfleet = _numbers(20.5, 5500.0, 380.0, 3.0)

    compared = versus(toolfleet, raw)

    assert compared["commands_difference_per_call"] == 2.5
    assert compared["bytes_ratio"] == 1.1
    assert compared["throughput_ratio"] == 0.95
    assert compared["cpu_ratio"]["orchestrator"] == 1.5
    assert compared["cpu_ratio"]["server"] is None
    assert ratio(1.0, 0.0) is None


def _cost_report(toolfleet: dict[str, Any]) -> dict[str, Any]:
    raw = _numbers(18.0, 5000.0, 400.0, 2.0)
    cost = {
        "runs": 50,
        "turns": 5,
        "width": 4,
        "rounds": 3,
        "pool": "prefork",
        "concurrency": 4,
        "contenders": {
            "celery_raw": raw,
            "toolfleet_async": toolfleet,
            "toolfleet_sync": toolfleet,
        },
        "versus_raw": {
            "toolfleet_async": versus(toolfleet, raw),
            "toolfleet_sync": versus(toolfleet, raw),
        },
        "idle": per_second(Usage(0, 2.0, {"brpop": 4}, 800, {"server": 0.01})),
    }
    return {"scenarios": {"cost": cost}}


def test_cost_targets_are_judged_against_raw_celery() -> None:
    """Given toolfleet within 3 commands, 1.2 x bytes and 0.9 x throughput of raw Celery,
    when judged, then all six targets pass; with 4 extra commands, those two miss."""
    report = _cost_report(_numbers(20.5, 5500.0, 380.0, 3.0))

    judged = {t["id"]: t for t in targets(report)}

    assert {
        f"g.{kind}.{mode}"
        for kind in ("commands", "bytes", "throughput")
        for mode in ("async", "sync")
    } == set(judged)
    assert all(t["pass"] for t in judged.values())

    worse = {t["id"]: t["pass"] for t in targets(_cost_report(_numbers(22.0, 5500.0, 380.0, 3.0)))}
    assert not worse["g.commands.async"] and not worse["g.commands.sync"]
    assert worse["g.bytes.async"] and worse["g.throughput.sync"]


def test_cost_tables_render() -> None:
    """Given a cost result, when the report is rendered, then the per-call table, the
    commands by name and the idle background are there."""
    report = _cost_report(_numbers(20.5, 5500.0, 380.0, 3.0))
    report["targets"] = targets(report)

    text = markdown(report)

    assert "g. Cost per call: 50 concurrent runs" in text
    assert "| toolfleet ainvoke | 20.50 | 5500 |" in text
    assert "+2.50 | 1.10 x | 0.95 x | 1.50 x |" in text
    assert "g. Redis commands per call by command" in text
    assert "| idle, 2.0 s | 2.0 | 400 |" in text


def test_gang_runs_a_job_on_every_thread_and_reports_failures() -> None:
    """Given a gang of 3 threads, when a job runs, then it runs 3 times at once; when a
    job raises, then the run raises with it."""
    gang = Gang(3)
    seen: list[str] = []
    try:
        gang.run(lambda: seen.append("ran"), timeout=10)
        assert seen == ["ran"] * 3

        def fail() -> None:
            raise KeyError("boom")

        with pytest.raises(RuntimeError, match="3 run"):
            gang.run(fail, timeout=10)
    finally:
        gang.close()
