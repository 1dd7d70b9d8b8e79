"""Why a missed target was missed: counted numbers are not blamed on the run's size or
load, and a command count over its target names the commands it runs beyond raw Celery."""

from __future__ import annotations

from typing import Any

from orchestrator.bench.targets import targets, why_missed


def _contender(commands: dict[str, float]) -> dict[str, Any]:
    return {
        "calls": 80,
        "commands_per_call": sum(commands.values()),
        "commands_by_name_per_call": commands,
        "bytes_per_call": 6000.0,
        "calls_per_second": 400.0,
        "cpu_ms_per_call": {"orchestrator": 1.0, "workers": 1.0, "server": 0.2, "total": 2.2},
    }


def _report(toolfleet: dict[str, float], raw: dict[str, float]) -> dict[str, Any]:
    """A quick run on a busy 2-core machine whose cost scenario counted these commands."""
    contenders = {
        "celery_raw": _contender(raw),
        "toolfleet_async": _contender(toolfleet),
        "toolfleet_sync": _contender(toolfleet),
    }
    difference = sum(toolfleet.values()) - sum(raw.values())
    versus = {
        "commands_difference_per_call": difference,
        "bytes_ratio": 1.1,
        "throughput_ratio": 0.95,
        "cpu_ratio": {"total": 1.0},
    }
    return {
        "quick": True,
        "machine": {"cores": 2, "loadavg_start": 6.5, "loadavg_end": 7.0},
        "scenarios": {
            "cost": {
                "runs": 4,
                "contenders": contenders,
                "versus_raw": {"toolfleet_async": versus, "toolfleet_sync": versus},
            }
        },
    }


RAW = {"get": 2.0, "publish": 1.0, "lpush": 1.0, "brpop": 1.0}
TOOLFLEET = {
    "get": 2.0,
    "publish": 2.0,
    "evalsha": 3.25,
    "set": 3.0,
    "exists": 1.0,
    "lpush": 1.0,
    "ping": 0.01,  # background traffic spread over the calls
}


def test_a_command_count_over_its_target_names_the_extra_commands_not_the_run() -> None:
    """Given a quick run on a busy machine whose toolfleet calls run 7.25 commands more
    than raw Celery's, when the missed g.commands targets say why, then the reason lists
    the commands run beyond raw Celery's, most first, and does not blame the run's size
    or the machine's load (a count is the same on any machine)."""
    report = _report(TOOLFLEET, RAW)

    missed = {t["id"]: t for t in targets(report) if not t["pass"]}

    assert set(missed) == {"g.commands.async", "g.commands.sync"}
    why = missed["g.commands.async"]["why"]
    assert "quick run" not in why and "busy" not in why, why
    assert "evalsha +3.25, set +3, exists +1, publish +1" in why, why
    assert why.index("evalsha") < why.index("set") < why.index("exists"), why
    assert "ping" not in why, why


def test_a_timed_number_still_names_the_run_conditions() -> None:
    """Given the same quick run on a busy machine, a missed ratio of times (throughput)
    still gives the run's size and load first."""
    report = _report(TOOLFLEET, RAW)

    why = why_missed("g.throughput.async", report)

    assert why.startswith("a quick run's sizes are too small for a stable number"), why
    assert "the machine was busy (load average 7 on 2 cores)" in why, why


def test_the_round_trip_target_counts_the_worker_beside_a_bare_celery_worker() -> None:
    """Given scenario f's counts, when the targets are read, then each delay's target is
    the worker's round trips beyond its delivery alone (the orchestrator's publication is
    not one of the worker's), named beside a bare Celery worker's count."""
    point = {
        "delay_ms": 20,
        "round_trips": {
            "orchestrator_total": 1.0,
            "worker_beyond_delivery": 3.0,
            "worker": {"BRPOP": 1.0, "EVALSHA": 2.0, "ZADD+HSET": 1.0},
        },
    }
    report = {
        "machine": {"cores": 2},
        "scenarios": {
            "links": {
                "points": [point],
                "celery_raw": {"worker_beyond_delivery": 4.15, "worker": {}},
            }
        },
    }
    (found,) = [t for t in targets(report) if t["id"] == "f.rt20"]
    assert found["value"] == 3.0 and found["limit"] == 2.0 and not found["pass"]
    assert "raw Celery's: 4.15" in found["what"]
    assert "waits for a slot" in why_missed("f.rt20", report)


def test_a_prefork_workers_round_trips_are_a_target_of_their_own() -> None:
    """Given scenario f's count for a prefork worker, when the targets are read, then it is
    a target of its own, beside a bare Celery worker's count, and its miss names what
    bounds it: a call that waits for a slot is started when the pool takes it."""
    report = {
        "machine": {"cores": 2},
        "scenarios": {
            "links": {
                "points": [],
                "celery_raw": {"worker_beyond_delivery": 3.9, "worker": {}},
                "prefork": {"worker_beyond_delivery": 3.0, "worker": {"EVALSHA": 2.0}},
            }
        },
    }
    (found,) = [t for t in targets(report) if t["id"] == "f.prefork"]
    assert found["value"] == 3.0 and found["limit"] == 2.0 and not found["pass"]
    assert "raw Celery's: 3.9" in found["what"] and "prefork" in found["what"]
    assert "waits for a slot" in found["why"]
