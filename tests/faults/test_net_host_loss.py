"""A whole worker host vanishes mid-call (its link cut, then every process on it
SIGKILLed: no FIN, no RST reaches anyone, as when a machine is switched off or its
network goes): the call runs again on another host within seconds, at the default
policy's 300 s time limit, and a non-idempotent call is not run twice. On both brokers.

The worker's lease (:mod:`tool_workers.celery_ext.lease`) lapses ``TOOLFLEET_LEASE_TTL``
(10 s) after the host stopped renewing it, and the surviving worker's next sweep hands
the call on: on Redis it puts kombu's unacknowledged message back on its queue (the
visibility timeout, 330 s here, is only the last resort); on RabbitMQ, which keeps the
original until its heartbeat notices the dead connection, it publishes a copy and fences
the original, which is dropped when RabbitMQ redelivers it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.test_worker_crash import AgentRun
from tests.support.fleet import wait_started
from tests.support.net_fleet import NetFleet
from tests.support.net_tools import read_effects
from tool_workers.contract.broker import visibility_timeout

pytestmark = pytest.mark.timeout(240)

DEFAULT_POLICY = Path(__file__).resolve().parent / "net_default_policy.toml"

RUNNING_WITHIN = 15.0
"""Seconds after the loss by which the call runs on another host, or is answered."""


def default_fleet(
    make_fleet: Callable[..., NetFleet],
    broker: str = "redis",
    request: pytest.FixtureRequest | None = None,
) -> NetFleet:
    """Two worker hosts with the default policy (300 s limit, 30 s redelivery margin), on
    ``broker``: RabbitMQ for the calls (through a proxy on the test subnet) and Redis for
    the rest, or Redis for all."""
    if broker == "rabbitmq":
        assert request is not None
        request.getfixturevalue("amqp_url")  # fails, naming the server, if it does not answer
    fleet = make_fleet(config=DEFAULT_POLICY, redelivery_margin=30.0, broker=broker)
    policies = fleet.settings.policies()
    assert policies.for_tool("step").time_limit == 300
    assert visibility_timeout(policies, fleet.settings.redelivery_margin) == 330
    return fleet


def host_loss_trial(fleet: NetFleet, tool: str) -> tuple[str, str, float | None, float]:
    """Run one call, make the host running it vanish; (content, status, seconds from the
    loss to the start on the other host (None if it did not start again), seconds to
    answer)."""
    first = fleet.start_worker("w1", pool="prefork", concurrency=2)
    second = fleet.start_worker("w2", pool="prefork", concurrency=2)
    run = AgentRun(fleet.settings, tool, {"seconds": 3}).start()
    started = wait_started(fleet.settings, run.task_id)
    victim = first if started["hostname"] == first.hostname else second
    time.sleep(0.5)  # inside the call

    fleet.net.cut(victim.host, "both")  # nothing it sends gets out, not even a FIN
    victim.host.kill()
    killed_at, killed = time.time(), time.monotonic()

    message = run.result(timeout=120)
    answered = time.monotonic() - killed
    starts = [at for event, key, _, at in _events(fleet) if key == run.task_id and event == "start"]
    rerun = starts[1] - killed_at if len(starts) > 1 else None
    shown = "not run again" if rerun is None else f"running elsewhere {rerun:.1f}s after"
    print(
        f"\n[host vanished, {fleet.broker}, {tool}, 300 s limit] {shown}, "
        f"answered {answered:.1f}s after the loss"
    )
    return str(message.content), message.status, rerun, answered


def test_an_idempotent_call_of_a_vanished_host_runs_on_another_host_within_seconds(
    net_fleet: Callable[..., NetFleet], broker: str, request: pytest.FixtureRequest
) -> None:
    """Given two worker hosts and the default 300 s time limit, when the host running an
    idempotent call vanishes, then the call is running on the other host within 15 s
    (not after the 330 s visibility timeout, nor RabbitMQ's heartbeat) and completes."""
    fleet = default_fleet(net_fleet, broker, request)
    content, status, rerun, answered = host_loss_trial(fleet, "step")
    assert status == "success", content
    assert content == "slept 3"
    assert [e for e, *_ in _events(fleet)] == ["start", "start", "end"]  # cut short, rerun
    assert rerun is not None and rerun < RUNNING_WITHIN, rerun
    assert answered < RUNNING_WITHIN + 5, answered


def test_a_non_idempotent_call_of_a_vanished_host_is_answered_within_seconds_not_run_again(
    net_fleet: Callable[..., NetFleet], broker: str, request: pytest.FixtureRequest
) -> None:
    """Given a non-idempotent call at the default time limit, when its host vanishes
    mid-call, then within 15 s the model gets an error saying its worker was lost or
    unreachable and it may have partially run; it ran once."""
    fleet = default_fleet(net_fleet, broker, request)
    content, status, rerun, answered = host_loss_trial(fleet, "pay")
    assert status == "error"
    assert "may have partially run" in content, content
    assert "lost or became unreachable" in content, content
    assert "not run again" in content, content
    assert [e for e, *_ in _events(fleet)] == ["start"]
    assert rerun is None
    assert answered < RUNNING_WITHIN, answered


def _events(fleet: NetFleet) -> list[tuple[str, str, int, float]]:
    return read_effects(fleet.effects_file)


@pytest.mark.soak
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tool", ["step", "pay"])
@pytest.mark.parametrize("repeat", range(5))
def test_a_vanished_host_costs_seconds_every_time(
    net_fleet: Callable[..., NetFleet],
    broker: str,
    request: pytest.FixtureRequest,
    tool: str,
    repeat: int,
) -> None:
    """The trials above, 5 times each per broker: an idempotent call runs elsewhere, a
    non-idempotent one is answered "may have partially run", within 15 s every time, and
    nothing runs a third time (or, non-idempotent, a second)."""
    fleet = default_fleet(net_fleet, broker, request)
    content, status, rerun, answered = host_loss_trial(fleet, tool)
    if tool == "step":
        assert status == "success", content
        assert rerun is not None and rerun < RUNNING_WITHIN, rerun
        assert answered < RUNNING_WITHIN + 5, answered
        assert [e for e, *_ in _events(fleet)] == ["start", "start", "end"]
    else:
        assert status == "error" and "may have partially run" in content, content
        assert rerun is None
        assert answered < RUNNING_WITHIN, answered
        assert [e for e, *_ in _events(fleet)] == ["start"]
