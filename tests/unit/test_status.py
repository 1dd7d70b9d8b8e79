"""`toolfleet status` output: tables for people, JSON for scripts."""

from __future__ import annotations

import json

from rich.console import Console

from orchestrator.cli.status import FleetStatus, InFlightCall, QueueStatus, WorkerStatus, render

STATUS = FleetStatus(
    namespace="",
    workers=[
        WorkerStatus("tool-worker@a", 7, ["tools"], ["grep", "read_file"], 1, 0.4),
        WorkerStatus("tool-worker@b", 8, ["tools"], ["grep", "read_file"], None, 2.0),
    ],
    queues=[
        QueueStatus("sandbox", 3, 0, []),
        QueueStatus("tools", 0, 2, ["grep", "read_file"]),
    ],
    in_flight=[InFlightCall("grep", "t1", "tool-worker@a", "(grep call=c1 thread=th)", 2.5)],
    unresponsive=["tool-worker@b"],
)


def test_tables_show_workers_queues_and_calls() -> None:
    console = Console(record=True, width=160)

    render(STATUS, console)

    text = console.export_text()
    assert "Workers online: 2" in text
    assert "In-flight calls: 1" in text
    assert "(grep call=c1 thread=th)" in text
    assert "none: calls here wait" in text  # sandbox: waiting calls, no worker
    assert "did not answer inspect active: tool-worker@b" in text


def test_json_form_counts_in_flight_calls() -> None:
    data = json.loads(json.dumps(STATUS.to_dict()))

    assert data["in_flight_count"] == 1
    assert data["queues"][0] == {"name": "sandbox", "depth": 3, "workers": 0, "tools": []}
    assert data["workers"][1]["active"] is None
