"""`toolfleet status` output: tables for people, JSON for scripts."""

from __future__ import annotations

import json

from rich.console import Console

from orchestrator.cli.status import (
    FleetStatus,
    InFlightCall,
    QueueStatus,
    ToolRoute,
    WorkerStatus,
    live_placement,
    render,
    routing_warnings,
)
from tool_workers.contract.models import ToolSpec, WorkerEntry

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


def _text(status: FleetStatus) -> str:
    console = Console(record=True, width=200)
    render(status, console)
    return console.export_text()


def test_a_consumed_queue_no_tool_is_routed_to_says_so() -> None:
    """A queue a worker consumes with no tool routed there holds no waiting calls."""
    status = FleetStatus("", [], [QueueStatus("prefork", 0, 1, [])], [])

    text = _text(status)

    assert "no tools routed here" in text
    assert "calls here wait" not in text


def test_two_workers_of_one_node_name_are_warned_about() -> None:
    status = FleetStatus("", [STATUS.workers[0]], [], [], duplicates=["tool-worker@a"])

    assert "more than one worker process runs as tool-worker@a" in _text(status)


def _record(host: str, pid: int) -> dict[str, object]:
    return {"host": host, "pid": pid, "at": 0.0, "tools": {"grep": {"placement": "remote"}}}


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_placement_of_exited_processes_on_this_host_is_dropped() -> None:
    """A record of a pid on this host that no longer runs is not shown; a live one and
    another host's (which cannot be checked from here) are."""
    import os

    dead, live, remote = _record("h", _dead_pid()), _record("h", os.getpid()), _record("o", 1)

    assert live_placement([dead, live, remote], host="h") == [live, remote]


def test_placement_of_another_host_is_one_line_not_a_table() -> None:
    import socket

    here = _record(socket.gethostname(), 1)
    status = FleetStatus("", [], [], [], placement=[here, _record("elsewhere", 42)])

    text = _text(status)

    assert text.count("Tool placement") == 1
    assert "orchestrator elsewhere:42 published its tool placement" in text


def _worker(name: str, queues: list[str], tools: list[str]) -> WorkerEntry:
    specs = [ToolSpec(name=t, description=t, args_schema={}, queue="tools") for t in tools]
    return WorkerEntry(worker=name, pid=1, queues=queues, tools=specs, updated_at=0.0)


def test_kinds_sharing_a_queue_with_different_tools_are_no_warning() -> None:
    """The quick start's two kinds on ``tools``: a call reaching the other kind is handed
    on, so nothing is said."""
    entries = [_worker("builtins@a", ["tools"], ["grep"]), _worker("project@a", ["tools"], ["add"])]
    routes = [ToolRoute("grep", "v1", "tools", ["builtins@a"], True)]
    routes.append(ToolRoute("add", "v1", "tools", ["project@a"], True))

    assert routing_warnings(entries, routes) == []


def test_a_tool_routed_to_a_queue_no_worker_consumes_is_one_warning() -> None:
    entries = [_worker("builtins@a", ["tools"], ["grep", "run_python"])]
    routes = [
        ToolRoute("run_python", "v1", "sandbox", ["builtins@a"], True),
        ToolRoute("run_python", "v2", "sandbox", ["builtins@a"], False),
        ToolRoute("grep", "v1", "tools", ["builtins@a"], True),
    ]

    (warning,) = routing_warnings(entries, routes)

    assert "'sandbox'" in warning and "run_python" in warning and "-Q sandbox" in warning
