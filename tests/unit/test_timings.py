"""CallTimings: publication-to-start and publication-to-result, once per call."""

from __future__ import annotations

import time

from orchestrator.call import PreparedCall
from orchestrator.dispatch.timings import CallTimings


def call(tool: str, task_id: str) -> PreparedCall:
    return PreparedCall(tool=tool, call_id=task_id, args={}, task_id=task_id)


def test_each_call_reports_its_start_once_and_its_result_once() -> None:
    """Given published calls, when their states arrive (a repeated STARTED, then a ready
    state), then each reports one start and one result, by tool; a forgotten call
    reports nothing more."""
    starts: list[tuple[str, float]] = []
    results: list[tuple[str, float]] = []
    timings = CallTimings(
        on_start=lambda tool, s: starts.append((tool, s)),
        on_result=lambda tool, s: results.append((tool, s)),
    )

    def observe(task_id: str, state: str, meta: dict[str, object]) -> None:
        timings.state(task_id, state)

    timings.publishing([call("grep", "a"), call("echo", "b"), call("echo", "c")])
    time.sleep(0.01)
    observe("a", "STARTED", {})
    observe("a", "STARTED", {})
    observe("a", "SUCCESS", {})
    observe("b", "FAILURE", {})
    timings.forget("c")
    observe("c", "STARTED", {})
    observe("unknown", "SUCCESS", {})

    assert [tool for tool, _ in starts] == ["grep"]
    assert [tool for tool, _ in results] == ["grep", "echo"]
    assert all(seconds >= 0.01 for _, seconds in starts + results)
    assert timings.pending() == 0
