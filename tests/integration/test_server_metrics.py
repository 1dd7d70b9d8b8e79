"""``toolfleet serve``'s ``/metrics``: runs, calls in flight and call timings, no token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from prometheus_client.parser import text_string_to_metric_families

from tests.support.serving import ServerProcess, prefork_fleet, run, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(120)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(prefork_fleet, tmp_path_factory.mktemp("server"), "metrics")
    yield process
    process.stop()


def scrape(server: ServerProcess) -> Series:
    """Every ``toolfleet_server_*`` sample by (name, labels), fetched without a token."""
    response = httpx.get(f"{server.url}/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    series: Series = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name.startswith("toolfleet_server_"):
                series[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return series


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    text = json.dumps({"calls": [list(c) for c in calls], "model_delay": 0})
    return {"messages": [{"role": "user", "content": text}]}


def test_metrics_show_runs_calls_and_their_timings(server: ServerProcess) -> None:
    """Given the server, when a run fans out two 2 s calls and a second run waits for the
    thread, then /metrics (no token) shows one run active, one queued and two calls in
    flight; once both runs end, nothing is active, and each of the three calls has one
    dispatch-to-start and one result-wait observation for its tool, the waits at least
    as long as the tools ran."""
    sleep = {"tool": "sleep_for"}
    key = tuple(sleep.items())
    idle = scrape(server)
    assert idle[("toolfleet_server_runs_active", ())] == 0
    assert idle[("toolfleet_server_runs_queued", ())] == 0
    assert idle[("toolfleet_server_calls_in_flight", ())] == 0
    assert idle[("toolfleet_server_redis_data_lost_total", ())] == 0
    assert idle[("toolfleet_server_runs_handed_on_total", ())] == 0
    for outcome in ("resumed", "lost"):
        assert idle[("toolfleet_server_runs_taken_over_total", (("outcome", outcome),))] == 0
    assert idle[("toolfleet_server_runs_max", ())] == server.settings.max_runs
    assert ("toolfleet_server_call_result_wait_seconds_count", key) not in idle

    async def scenario() -> Series:
        api_key = server.settings.api_tokens[0]
        async with get_client(url=server.url, api_key=api_key) as c:
            thread = await c.threads.create()
            tid = thread["thread_id"]
            await c.runs.create(
                tid,
                "agent",
                input=ask(("sleep_for", {"seconds": 2}), ("sleep_for", {"seconds": 2})),
            )
            queued = await c.runs.create(
                tid,
                "agent",
                input=ask(("sleep_for", {"seconds": 0.2})),
                multitask_strategy="enqueue",
            )
            busy: Series = {}
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                busy = await asyncio.to_thread(scrape, server)
                if busy[("toolfleet_server_calls_in_flight", ())] == 2:
                    break
                await asyncio.sleep(0.05)
            await c.runs.join(tid, queued["run_id"])
            return busy

    busy = run(scenario())
    assert busy[("toolfleet_server_calls_in_flight", ())] == 2
    assert busy[("toolfleet_server_runs_active", ())] == 1
    assert busy[("toolfleet_server_runs_queued", ())] == 1

    done = scrape(server)
    assert done[("toolfleet_server_runs_active", ())] == 0
    assert done[("toolfleet_server_runs_queued", ())] == 0
    assert done[("toolfleet_server_calls_in_flight", ())] == 0
    assert done[("toolfleet_server_call_dispatch_to_start_seconds_count", key)] == 3
    assert done[("toolfleet_server_call_result_wait_seconds_count", key)] == 3
    waited = done[("toolfleet_server_call_result_wait_seconds_sum", key)]
    to_start = done[("toolfleet_server_call_dispatch_to_start_seconds_sum", key)]
    assert waited >= 2 + 2 + 0.2
    assert to_start < waited - 4


def test_metrics_show_waiting_calls_per_queue_tool_and_worker_kind(
    server: ServerProcess, prefork_fleet: Settings
) -> None:
    """Given the fleet's workers, when /metrics is scraped, then it has the waiting-call
    gauges of every queue the workers consume (tool queues included), of each routed tool
    and of each worker kind, all zero with nothing waiting."""
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 200
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name.endswith("_waiting_calls"):
                (label,) = sample.labels.values()
                found.setdefault(sample.name, {})[label] = sample.value
    queues = found["toolfleet_queue_waiting_calls"]
    assert "tools" in queues
    assert any(q.startswith("tool:sleep_for:") for q in queues)
    assert "sleep_for" in found["toolfleet_tool_waiting_calls"]
    assert found["toolfleet_worker_kind_waiting_calls"]
    assert all(v == 0 for series in found.values() for v in series.values())
