"""A worker host cut off for longer than its lease: its call is handed on, and the stale
attempt cannot overwrite the answer.

Two worker hosts with the default policy (300 s limit: the stale worker retries its store
for up to the 330 s visibility timeout); the one running the call is cut off (both
directions) for 60 s while the call finishes there. Its lease lapses 10 s into the cut,
the other host's sweep puts the call back on the queue, and:

* an idempotent call runs again on the other host and the model gets that result; after
  the heal the stale worker's late result is refused (the fence names the new attempt),
  and nothing runs a third time;
* a non-idempotent call is not run again: the model gets an error saying its worker was
  lost or unreachable and it may have partially run. The stale worker's real result,
  which reached Redis only after the heal, is refused too: the model already has its
  one answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.faults.test_net_host_loss import default_fleet
from tests.faults.test_worker_crash import AgentRun
from tests.support.fleet import wait_started
from tests.support.hosts import HostWorker
from tests.support.net_fleet import NetFleet
from tool_workers.contract.broker import create_app

pytestmark = pytest.mark.timeout(240)

CUT = 60.0
"""Seconds the worker running the call is cut off: six times its lease."""

AFTER_HEAL = 12.0
"""Seconds the stale worker is given after the heal to store, acknowledge or run anything."""


def stored_result(fleet: NetFleet, task_id: str) -> dict[str, Any]:
    """The state stored for a call: its status and result (the result names the worker)."""
    app = create_app(fleet.settings)
    client = redis.Redis.from_url(fleet.settings.backend_url)
    try:
        raw = client.get(app.backend.get_key_for_task(task_id))
        assert raw is not None, "nothing stored"
        return dict(json.loads(raw))
    finally:
        client.close()
        app.close()


def cut_trial(fleet: NetFleet, tool: str) -> tuple[str, Any, HostWorker, HostWorker, float]:
    """Run a 3 s call, cut its worker off for 60 s; (task id, ToolMessage, victim,
    survivor, seconds from the cut to the answer)."""
    first = fleet.start_worker("w1", pool="prefork", concurrency=2)
    second = fleet.start_worker("w2", pool="prefork", concurrency=2)
    run = AgentRun(fleet.settings, tool, {"seconds": 3}).start()
    started = wait_started(fleet.settings, run.task_id)
    victim, survivor = (first, second) if started["hostname"] == first.hostname else (second, first)

    fleet.net.cut(victim.host, "both")
    cut_at = time.monotonic()
    try:
        message = run.result(timeout=CUT - 5)  # answered while the victim is still cut off
        answered = time.monotonic() - cut_at
        time.sleep(max(0.0, CUT - (time.monotonic() - cut_at)))
    finally:
        fleet.net.heal()
    time.sleep(AFTER_HEAL)
    print(f"\n[cut {CUT:g}s, {tool}] answered {answered:.1f}s into the cut")
    return run.task_id, message, victim, survivor, answered


def test_an_idempotent_call_of_a_cut_off_worker_runs_elsewhere_and_the_late_result_is_refused(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given an idempotent call that finishes on a worker cut off for 60 s, then it runs
    again on the other worker within seconds, the model gets that one answer, the stale
    worker's result stored after the heal does not replace it, and the call runs no third
    time."""
    fleet = default_fleet(net_fleet)
    task_id, message, victim, survivor, answered = cut_trial(fleet, "step")

    assert message.status == "success", message.content
    assert message.content == "slept 3"
    assert answered < 30, answered
    stored = stored_result(fleet, task_id)
    assert stored["status"] == "SUCCESS"
    assert stored["result"]["worker"] == survivor.hostname
    assert fleet.effects(task_id) == ["start", "end", "start", "end"]  # stale, then rerun
    assert fleet.seconds_to_pong(victim) < 10  # the stale worker serves again
    assert victim.log_file is not None
    log = victim.log_file.read_text(errors="replace")
    assert "lease lapsed" in log, log[-3000:]
    # Its late store was refused, or its execution stopped before it could try again.
    assert "did not store a state of call" in log or "stopping call" in log, log[-3000:]
    print(*[line for line in log.splitlines() if "handed on" in line or "stopping" in line],
          sep="\n")  # fmt: skip


def test_a_non_idempotent_call_of_a_cut_off_worker_is_answered_once_and_not_run_again(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given a non-idempotent call that finishes on a worker cut off for 60 s, then the
    model gets, within seconds, an error saying its worker was lost or unreachable and it
    may have partially run; it ran once, and its late real result does not replace the
    answer the model already has."""
    fleet = default_fleet(net_fleet)
    task_id, message, victim, _, answered = cut_trial(fleet, "pay")

    assert message.status == "error"
    assert "may have partially run" in message.content, message.content
    assert "lost or became unreachable" in message.content, message.content
    assert answered < 30, answered
    assert fleet.effects(task_id) == ["start", "end"]  # ran once, on the cut-off worker
    stored = stored_result(fleet, task_id)
    assert stored["result"]["error_kind"] == "redelivered", stored
    assert fleet.seconds_to_pong(victim) < 10
