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
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.faults.test_net_host_loss import default_fleet
from tests.faults.test_worker_crash import AgentRun
from tests.support.fleet import wait_started
from tests.support.hosts import HostWorker
from tests.support.net_fleet import NetFleet
from tool_workers.contract.broker import create_app
from tool_workers.contract.failed import result_of_failure

SHORT_POLICY = Path(__file__).resolve().parent / "net_short_policy.toml"

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
    net_fleet: Callable[..., NetFleet], broker: str, request: pytest.FixtureRequest
) -> None:
    """Given an idempotent call that finishes on a worker cut off for 60 s, then it runs
    again on the other worker within seconds, the model gets that one answer, the stale
    worker's result stored after the heal does not replace it, and the call runs no third
    time. On RabbitMQ the call is handed on as a copy; RabbitMQ gives the original back
    too, once its heartbeat closes the cut-off worker's connection (20 to 30 s into the
    cut), and that delivery is dropped unrun."""
    fleet = default_fleet(net_fleet, broker, request)
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
    # Its late store was refused (kept as the call's late result), or its execution
    # stopped before it could try again.
    refused = ("did not store a state of call", "late result of call", "stopping call")
    assert any(line in log for line in refused), log[-3000:]
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
    # An error result is stored as a failed task carrying it (tool_workers.contract.failed).
    assert stored["status"] == "FAILURE", stored
    assert (result_of_failure(stored["result"]) or {}).get("error_kind") == "redelivered", stored
    assert fleet.seconds_to_pong(victim) < 10


SERVES_WITHIN = 15.0
"""Seconds after a heal by which a worker cut off past its lease serves again or exited."""

DIED = ("Unrecoverable error", "consumer is not running")
"""What a worker's log says when its consumer died (Celery's line, and toolfleet's)."""


def serves_or_exited(
    fleet: NetFleet, worker: HostWorker, within: float, *, new_call: bool = True
) -> str:
    """Wait up to ``within`` s for ``worker`` to answer a ping and (``new_call``) run a
    new call (``"serving"``), or to have exited (``"exited"``); raises if it is neither:
    a zombie."""
    assert worker.process is not None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if worker.process.poll() is not None:
            return "exited"
        try:
            answered = fleet.app.control.ping(destination=[worker.hostname], timeout=0.5)
        except Exception:  # the broker link of the test process is fine; retry anyway
            answered = []
        if answered and not new_call:
            return "serving"
        if answered:
            probe = AgentRun(fleet.settings, "step", {"seconds": 0.1}).start()
            assert probe.result(timeout=within).content == "slept 0.1"
            return "serving"
        time.sleep(0.2)
    raise AssertionError(
        f"{worker.hostname} neither serves nor exited {within:g} s after the heal (a zombie)"
    )


def beyond_lease_trial(make_fleet: Callable[..., NetFleet], cut: float) -> dict[str, float]:
    """Two workers; the one running a 5 s call is cut off (both ways) 1 s into it for
    ``cut`` s, longer than its lease, so the call is handed on to the other: after the
    heal the call is answered, and the cut-off worker serves again within seconds (the
    other is stopped first, so the new call can only be its), its consumer alive
    throughout."""
    fleet = make_fleet()
    first = fleet.start_worker("w1", pool="prefork", concurrency=2, events=True)
    second = fleet.start_worker("w2", pool="prefork", concurrency=2, events=True)
    run = AgentRun(fleet.settings, "step", {"seconds": 5}).start()
    started = wait_started(fleet.settings, run.task_id)
    victim, other = (first, second) if started["hostname"] == first.hostname else (second, first)
    time.sleep(1)

    fleet.net.cut(victim.host, "both")
    try:
        time.sleep(cut)
    finally:
        fleet.net.heal()
    healed = time.monotonic()

    state = serves_or_exited(fleet, victim, SERVES_WITHIN, new_call=False)
    back = time.monotonic() - healed
    message = run.result(timeout=120)  # answered, whichever attempt's answer it is
    fleet.warm_shutdown(other)
    if state == "serving":
        state = serves_or_exited(fleet, victim, SERVES_WITHIN)
    assert victim.log_file is not None
    log = victim.log_file.read_text(errors="replace")
    died = [line for line in log.splitlines() if any(text in line for text in DIED)]
    print(f"\n[cut {cut:g}s beyond the lease] {state} (a ping) {back:.1f}s after the heal; "
          f"the call: {message.status}")  # fmt: skip
    assert not died, "\n".join(died) + "\n" + log[-4000:]
    assert state == "serving", log[-4000:]
    return {"back": back}


def test_a_worker_cut_off_past_its_lease_and_visibility_timeout_serves_again(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given a worker running a call, when it is cut off for 20 s (twice its 10 s lease;
    the visibility timeout shortened to 12 s, so past it too), then after the heal its
    consumer never died, and it answers a ping and takes a new call within seconds."""
    beyond_lease_trial(lambda: net_fleet(config=SHORT_POLICY, redelivery_margin=2.0), cut=20)


@pytest.mark.soak
@pytest.mark.timeout(4000)
@pytest.mark.parametrize("cut", [20, 60, 400])
@pytest.mark.parametrize("repeat", range(10))
def test_a_worker_cut_off_past_its_lease_serves_again_every_time(
    net_fleet: Callable[..., NetFleet], cut: float, repeat: int
) -> None:
    """The trial above with the default policy (330 s visibility timeout), 10 times each
    for cuts of 20, 60 and 400 s: no consumer death, never a zombie."""
    beyond_lease_trial(lambda: default_fleet(net_fleet), cut=cut)


def test_a_stale_execution_is_stopped_when_its_worker_learns_the_call_runs_elsewhere(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given a 40 s idempotent call whose worker is cut off for 20 s (its lease lapses
    10 s in, and the other worker runs the call again), when the link is back, then the
    stale execution is stopped (it never reaches its end), the rerun's result is the
    model's answer, and the stale worker serves again."""
    fleet = default_fleet(net_fleet)
    first = fleet.start_worker("w1", pool="prefork", concurrency=2)
    second = fleet.start_worker("w2", pool="prefork", concurrency=2)
    run = AgentRun(fleet.settings, "step", {"seconds": 40}).start()
    started = wait_started(fleet.settings, run.task_id)
    victim, survivor = (first, second) if started["hostname"] == first.hostname else (second, first)

    fleet.net.cut(victim.host, "both")
    try:
        time.sleep(20)
    finally:
        fleet.net.heal()

    message = run.result(timeout=120)
    assert message.status == "success", message.content
    assert stored_result(fleet, run.task_id)["result"]["worker"] == survivor.hostname
    assert fleet.effects(run.task_id) == ["start", "start", "end"]  # the stale one stopped
    assert victim.log_file is not None
    log = victim.log_file.read_text(errors="replace")
    assert "stopping call" in log, log[-3000:]
    assert serves_or_exited(fleet, victim, SERVES_WITHIN) == "serving"
