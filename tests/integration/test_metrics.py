"""Prometheus metrics of a real prefork worker: every outcome counted once, none lost."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from tests.support.fleet import running_pid
from tests.support.serving import free_port
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings
from tool_workers.observability.metrics import CALLS, DURATION

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, str, str], float]


def call(tool: str, **args: Any) -> PreparedCall:
    call_id = f"{tool}-{time.monotonic_ns()}"
    return PreparedCall(tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id))


def scrape(port: int, worker: str) -> Samples:
    """The worker's per-call samples (calls and durations) by (sample name, tool,
    outcome), ``le`` buckets left out; the worker's other families (late results, Redis
    data lost) are not per call."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith((CALLS, DURATION)) or "le" in sample.labels:
                continue
            assert sample.labels["worker"] == worker
            key = (sample.name, sample.labels["tool"], sample.labels["outcome"])
            samples[key] = sample.value
    return samples


def test_worker_counts_every_outcome_by_tool_under_prefork(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    """Given a prefork worker with TOOLFLEET_METRICS_PORT, when calls succeed, fail in the
    tool, get bad arguments, are retried, hit the soft and the hard time limit, lose their
    pool process and are cancelled, then one scrape of the worker counts each outcome per
    tool exactly, with a duration for each that has one, and the files of the pool
    processes that died are folded away without losing a count."""
    port = free_port()
    metrics_dir = tmp_path / "metrics"
    settings = make_settings(metrics_port=port, metrics_host="127.0.0.1", metrics_dir=metrics_dir)
    worker = start_worker(settings, pool="prefork", concurrency=2)
    dispatcher = dispatcher_for(settings=settings)

    batch = [
        *(call("add", a=i, b=1) for i in range(3)),
        call("boom", reason="one"),
        call("boom", reason="two"),
        call("add", a="not a number", b=1),
        call("flaky", times=1),
        call("hang", seconds=30),  # the soft limit (2 s) interrupts it: a result
        call("hard_hang", seconds=30),  # only the hard limit (2 s) stops it: no result
    ]
    dispatcher.submit(batch)
    results = [dispatcher.wait(c, timeout=30) for c in batch]
    assert [r.error_kind for r in results] == [
        None, None, None, "tool_error", "tool_error", "invalid_args", None, "timeout", "timeout"
    ]  # fmt: skip

    lost = call("touch", tag="lost", seconds=5)
    dispatcher.submit([lost])
    os.kill(running_pid(settings, lost.task_id), signal.SIGKILL)
    assert dispatcher.wait(lost, timeout=30).status == "success"  # run again

    cancelled = call("sleep_for", seconds=30)
    dispatcher.submit([cancelled])
    running_pid(settings, cancelled.task_id)
    dispatcher.cancel([cancelled], terminate=True)

    expected = {
        ("add", "success"): 3,
        ("add", "invalid_args"): 1,
        ("boom", "tool_error"): 2,
        ("flaky", "retry"): 1,
        ("flaky", "success"): 1,
        ("hang", "timeout"): 1,
        ("hard_hang", "timeout"): 1,
        ("touch", "lost"): 1,
        ("touch", "success"): 1,
        ("sleep_for", "cancelled"): 1,
    }
    calls: dict[tuple[str, str], float] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        samples = scrape(port, worker.hostname)
        calls = {
            (tool, outcome): value
            for (name, tool, outcome), value in samples.items()
            if name == "toolfleet_worker_calls_total"
        }
        if calls == expected:
            break
        time.sleep(0.2)
    assert calls == expected

    timed = {
        (tool, outcome): value
        for (name, tool, outcome), value in samples.items()
        if name == "toolfleet_worker_call_duration_seconds_count"
    }
    # A revoked call's duration is not known to the main process; every other one is.
    assert timed == {k: v for k, v in expected.items() if k[1] != "cancelled"}
    hard = samples[("toolfleet_worker_call_duration_seconds_sum", "hard_hang", "timeout")]
    assert 2.0 <= hard < 4.0

    # Three pool processes died (hard limit, SIGKILL, revoked): their files are folded.
    (directory,) = metrics_dir.iterdir()
    live = {worker.pid, *worker.children()}
    owners = {p.stem.rpartition("_")[2] for p in directory.glob("*.db")}
    assert "archive" in owners
    assert {int(pid) for pid in owners - {"archive"}} <= live

    worker.stop(grace=10)
    assert not directory.exists()
