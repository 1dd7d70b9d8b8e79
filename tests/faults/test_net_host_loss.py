"""A whole worker host is lost mid-call (every process on it SIGKILLed, as a reclaimed
machine stops): the call runs again on another host after the visibility timeout, and a
non-idempotent call is not run twice.

The trials use the network policy (visibility timeout 42 s, so a lost call is back within
a minute); the default policy's visibility timeout (330 s) is pinned by a unit test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.faults.test_worker_crash import AgentRun
from tests.support.fleet import wait_started
from tests.support.net_fleet import NetFleet
from tool_workers.app import RESTORE_INTERVAL, visibility_timeout

pytestmark = pytest.mark.timeout(240)


def host_loss_trial(fleet: NetFleet, tool: str) -> tuple[str, str, float, float]:
    """Run one call, kill the host running it; (content, status, seconds to answer, bound)."""
    first = fleet.start_worker("w1", pool="prefork", concurrency=2)
    second = fleet.start_worker("w2", pool="prefork", concurrency=2)
    run = AgentRun(fleet.settings, tool, {"seconds": 2}).start()
    started = wait_started(fleet.settings, run.task_id)
    victim = first if started["hostname"] == first.hostname else second
    time.sleep(0.5)  # inside the call

    victim.host.kill()
    killed = time.monotonic()

    bound = visibility_timeout(fleet.settings.policies(), fleet.settings.redelivery_margin)
    bound += RESTORE_INTERVAL + 2 + 5  # the scan interval, the call itself, slack
    message = run.result(timeout=bound + 30)
    elapsed = time.monotonic() - killed
    print(f"\n[host lost, {tool}] answered {elapsed:.1f}s after the kill (bound {bound:.0f}s)")
    return str(message.content), message.status, elapsed, bound


def test_an_idempotent_call_of_a_lost_host_completes_on_another_host(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given two worker hosts, when the host running an idempotent call is killed, then
    the call runs again on the other host, within the visibility timeout + the scan
    interval, and completes."""
    fleet = net_fleet()
    content, status, elapsed, bound = host_loss_trial(fleet, "step")
    assert status == "success", content
    assert content == "slept 2"
    effects = [e for e, *_ in _events(fleet)]
    assert effects == ["start", "start", "end"]  # cut short on the lost host, then rerun
    assert elapsed < bound


def test_a_non_idempotent_call_of_a_lost_host_is_not_run_again(
    net_fleet: Callable[..., NetFleet],
) -> None:
    """Given a non-idempotent call, when its host is killed mid-call, then it is not run
    again: the model gets an error saying it may have partially run."""
    fleet = net_fleet()
    content, status, elapsed, bound = host_loss_trial(fleet, "pay")
    assert status == "error"
    assert "may have partially run" in content
    assert [e for e, *_ in _events(fleet)] == ["start"]
    assert elapsed < bound


def _events(fleet: NetFleet) -> list[tuple[str, str, int, float]]:
    from tests.support.net_tools import read_effects

    return read_effects(fleet.effects_file)
