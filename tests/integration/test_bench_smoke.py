"""``toolfleet bench --quick`` runs every scenario and writes a valid report.

Benchmarks are not timed tests: this checks that the harness runs end to end (its own
embedded server and workers) and that its JSON report is complete and numeric, never
what the numbers are.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.bench.run import SCENARIOS

# Generous: the whole benchmark runs, and a shared machine may be loaded many times over.
pytestmark = pytest.mark.timeout(480)

REPO = Path(__file__).resolve().parents[2]


def numbers(value: Any, path: str = "$") -> list[tuple[str, float]]:
    """Every number in a JSON value, with its path."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [(path, float(value))]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in numbers(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [n for i, item in enumerate(value) for n in numbers(item, f"{path}[{i}]")]
    return []


WARNING = re.compile(r"warning|error|traceback|connection lost", re.IGNORECASE)
"""What a line a run must not print looks like (a logger's warning, a lost connection)."""


def warning_lines(output: str) -> list[str]:
    """The lines of ``output`` that warn or report an error."""
    return [line for line in output.splitlines() if WARNING.search(line)]


def missed_rows(stdout: str) -> list[list[str]]:
    """The Targets table's MISS rows as printed: their cells, continuation lines joined."""
    table = stdout[stdout.index("Targets") :]
    rows: list[list[str]] = []
    for line in table.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if cells[0]:  # a row starts with its target id
            rows.append(cells)
        elif rows:  # a wrapped cell goes on on the next line
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
    return [row for row in rows if "MISS" in row]


def run_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``toolfleet bench`` with ``args`` and ``--json``; the finished process and report."""
    report_path = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "bench", *args, "--json", str(report_path)],
        cwd=REPO,
        env={**env, "COLUMNS": "200"},  # the table's reasons wrap less
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(report_path.read_text())


def test_plain_quick_runs_its_scenarios_on_one_fleet_quietly_and_says_why_a_target_is_missed(
    tmp_path: Path,
) -> None:
    """Given nothing running, when `toolfleet bench --quick` runs (its scenarios sharing one
    worker, raw Celery's beside it), then every scenario reports, each ratio against raw
    Celery is measured, no line warns, and every MISS in the printed table gives its
    reason."""
    done, report = run_bench(tmp_path, "--quick")

    assert list(report["scenarios"]) == ["latency", "fanout", "throughput", "memory", "cost"]
    for name, scenario in report["scenarios"].items():
        assert "error" not in scenario, (name, scenario)
    cost = report["scenarios"]["cost"]
    assert set(cost["contenders"]) == {
        "celery_raw",
        "toolfleet_async",
        "toolfleet_sync",
        "agent_loop",
    }
    assert all(cost["contenders"][c]["calls"] > 0 for c in cost["contenders"])
    assert report["scenarios"]["throughput"]["celery_raw"]["per_second"] > 0
    assert report["leaks"] == {"in_flight": 0, "pending": 0, "subscriptions": 0}
    assert not warning_lines(done.stdout + done.stderr), warning_lines(done.stdout + done.stderr)
    missed = [t for t in report["targets"] if not t["pass"]]
    assert all(t["why"] for t in missed), missed
    rows = missed_rows(done.stdout)
    assert len(rows) == len(missed), rows
    assert all(row[-1] for row in rows), rows


def test_bench_help_lists_every_scenario() -> None:
    """`toolfleet bench --help` names every scenario there is, id and name."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "bench", "--help"],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.replace("│", " ").split())
    for key, name in SCENARIOS.items():
        assert f"{key} {name}" in text, (key, name, text)


def test_quick_bench_writes_a_complete_report(tmp_path: Path) -> None:
    """Given nothing running, when `toolfleet bench --quick --json` runs, then it exits 0
    within bounds and the report has every scenario, finite numbers and judged targets."""
    report_path = tmp_path / "bench.json"
    plot_path = tmp_path / "fanout.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "bench",
            "--quick",
            # scale and links too: plain --quick leaves them out (hosts and workers of
            # their own take tens of seconds).
            "--only",
            ",".join(SCENARIOS),
            "--json",
            str(report_path),
            "--plot",
            str(plot_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["schema"] == 1 and report["quick"] is True
    assert set(report["scenarios"]) == set(SCENARIOS.values())
    for name, scenario in report["scenarios"].items():
        assert "error" not in scenario, (name, scenario)
    found = numbers(report)
    assert found
    assert all(math.isfinite(value) for _, value in found), [
        p for p, v in found if not math.isfinite(v)
    ]
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["ram_gib"] > 0 and machine["python"]
    latency = report["scenarios"]["latency"]["modes"]
    assert all(latency[mode]["count"] > 0 for mode in latency)
    assert {p["mode"] for p in report["scenarios"]["fanout"]["points"]} == {"sync", "async"}
    assert [p["workers"] for p in report["scenarios"]["scale"]["points"]] == [1, 2, 4]
    assert report["leaks"] == {"in_flight": 0, "pending": 0, "subscriptions": 0}
    links = report["scenarios"]["links"]["points"]
    assert [p["delay_ms"] for p in links] == [0, 20, 50]
    for point in links:
        trips = point["round_trips"]
        assert trips["orchestrator"] and trips["worker"], trips
        assert point["fanout_phase"]["sync"]["count"] == point["fanout_phase"]["async"]["count"]
    # A bare Celery worker's round trips, counted the same way beside them.
    raw_trips = report["scenarios"]["links"]["celery_raw"]
    assert raw_trips["worker"].get("BRPOP") and raw_trips["worker_beyond_delivery"] > 0, raw_trips
    cost = report["scenarios"]["cost"]
    assert set(cost["contenders"]) == {
        "celery_raw",
        "toolfleet_async",
        "toolfleet_sync",
        "agent_loop",
    }
    for name, numbers_of in cost["contenders"].items():
        assert numbers_of["calls"] == cost["runs"] * cost["turns"] * cost["width"] * cost["rounds"]
        if name == "agent_loop":  # its tools run locally: no workers, no calls on Redis
            assert numbers_of["cpu_ms_per_call"]["workers"] == 0.0
            assert numbers_of["cpu_ms_per_call"]["orchestrator"] > 0
            continue
        assert numbers_of["commands_per_call"] > 0 and numbers_of["bytes_per_call"] > 0
        assert numbers_of["commands_by_name_per_call"]
    ids = {t["id"] for t in report["targets"]}
    assert {"a.sync", "a.async", "c", "d.sync", "d.async", "d.leaks", "e"} <= ids
    assert {"f.rt0", "f.rt20", "f.rt50"} <= ids
    kinds = ("commands", "bytes", "throughput")
    assert {f"g.{kind}.{mode}" for kind in kinds for mode in ("async", "sync")} <= ids
    assert {"g.cpu_total", "g.workers_cpu"} <= ids
    assert all(isinstance(t["pass"], bool) for t in report["targets"])
    # A missed target says why; the run prints no warning lines.
    assert all(t["why"] for t in report["targets"] if not t["pass"])
    assert not warning_lines(done.stdout + done.stderr), warning_lines(done.stdout + done.stderr)
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Targets" in done.stdout
    assert "f. Slow links" in done.stdout and "async / sync" in done.stdout
    assert "g. Cost per call" in done.stdout and "g. Idle background" in done.stdout


def test_quick_leaves_out_the_scenarios_with_hosts_of_their_own() -> None:
    """Given --quick without --only, then every scenario runs but scale and links (each
    starts hosts and workers of its own); --only still names any."""
    from orchestrator.bench.run import select

    assert select(None, quick=True) == ["latency", "fanout", "throughput", "memory", "cost"]
    assert select(None) == list(SCENARIOS.values())
    assert select("e,f", quick=True) == ["scale", "links"]
