"""A result that comes after its call was answered as lost is recorded, not dropped.

A non-idempotent ``pay`` call finishes on a worker host cut off from Redis (both
directions) for longer than its lease: the call is handed on, the other worker does not
run it again, and the model is answered that it may have partially run. After the heal
the cut worker's real result reaches Redis; the fence refuses it as the call's answer
(the model has its one answer), and it is kept as the call's late result:

* the worker logs it (``late result of call <task id>``) and counts it;
* the orchestrator that sent the call hears its late notice (a hook of its dispatcher;
  the call log's ``late_result`` event), naming the call;
* the thread's owner reads it by thread id (``late_results``; ``toolfleet late``), with
  the call id, even when no orchestrator was listening.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from orchestrator.dispatch.fleet import dispatcher_for
from orchestrator.dispatch.late import LateResult, late_results
from tests.faults.test_net_host_loss import default_fleet
from tests.faults.test_worker_crash import AgentRun
from tests.support.fleet import wait_started
from tests.support.net_fleet import NetFleet
from tool_workers.contract.broker import visibility_timeout

pytestmark = pytest.mark.timeout(240)

RECORDED_WITHIN = 30.0
"""Seconds after the heal by which the late result must be recorded and heard."""


def late_result_trial(
    make_fleet: Callable[..., NetFleet], cut: float, fleet: NetFleet | None = None
) -> None:
    fleet = fleet or default_fleet(make_fleet)
    first = fleet.start_worker("w1", pool="prefork", concurrency=2)
    second = fleet.start_worker("w2", pool="prefork", concurrency=2)
    heard: list[LateResult] = []
    dispatcher_for(settings=fleet.settings).lost.on_late(heard.append)
    run = AgentRun(fleet.settings, "pay", {"seconds": 3}).start()
    started = wait_started(fleet.settings, run.task_id)
    victim = first if started["hostname"] == first.hostname else second

    fleet.net.cut(victim.host, "both")
    cut_at = time.monotonic()
    try:
        message = run.result(timeout=cut - 2)  # answered while the victim is cut off
        time.sleep(max(0.0, cut - (time.monotonic() - cut_at)))
    finally:
        fleet.net.heal()
    healed = time.monotonic()
    assert message.status == "error"
    assert "may have partially run" in message.content, message.content

    client = redis.Redis.from_url(fleet.settings.backend_url)
    try:
        recorded: list[LateResult] = []
        while time.monotonic() - healed < RECORDED_WITHIN and not (recorded and heard):
            recorded = late_results(client, fleet.settings.key_prefix, run.thread_id)
            time.sleep(0.2)
    finally:
        client.close()
    came = time.monotonic() - healed
    print(f"\n[late result, cut {cut:g}s] recorded and heard {came:.1f}s after the heal")

    assert len(recorded) == 1, recorded
    (late,) = recorded
    assert (late.call_id, late.tool, late.thread_id) == (run.call_id, "pay", run.thread_id)
    assert late.answered == "redelivered"
    assert (late.status, late.content) == ("success", "paid after 3")
    assert [(h.call_id, h.content) for h in heard] == [(run.call_id, "paid after 3")]
    assert fleet.effects(run.task_id) == ["start", "end"]  # it ran once, on the cut worker
    assert victim.log_file is not None
    log = victim.log_file.read_text(errors="replace")
    assert f"late result of call {run.task_id}" in log, log[-3000:]


def test_a_late_result_after_a_20s_partition_is_recorded_with_its_call_id(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given a non-idempotent call that finishes on a worker cut off for 20 s (twice its
    lease), when the model has been answered that it may have partially run and the link
    heals, then the worker's real result is recorded as the call's late result: in the
    worker's log, heard by the orchestrator, and readable by thread with its call id."""
    late_result_trial(net_fleet, cut=20)


@pytest.mark.soak
def test_a_late_result_after_a_60s_partition_is_recorded_with_its_call_id(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """The 60 s partition of the trial above."""
    late_result_trial(net_fleet, cut=60)


def test_a_late_result_after_a_partition_past_the_visibility_timeout_is_the_real_one(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given the network tests' policy (longest time limit 40 s, redelivery margin 2 s: a
    42 s visibility timeout), when a non-idempotent call finishes on a worker cut off for
    55 s, then the worker has kept its result and retried the store past the visibility
    timeout: after the heal the real result is the call's late result, not "could not
    deliver the call's result"."""
    fleet = net_fleet()
    assert visibility_timeout(fleet.settings.policies(), fleet.settings.redelivery_margin) == 42
    late_result_trial(net_fleet, cut=55, fleet=fleet)
