"""A fleet on a Sentinel-managed Redis: it serves, and a failover mid fan-out loses no
call and runs no non-idempotent call twice.

Each test starts its own primary, replica and three Sentinels (tests.support.sentinel:
the embedded server's binary, on free loopback ports). Side effects are counted outside
Redis, in the ledger file of :mod:`tests.ledger_tools`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from orchestrator.cli.status import collect
from tests.support.fleet import (
    REPO,
    ledger_runs,
    one_turn,
    run_in_thread,
    started_calls,
    wait_until,
    workers_idle,
)
from tests.support.sentinel import MASTER, SentinelRedis
from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import redis_client
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(240)

LOSS_POLICY = REPO / "tests" / "faults" / "loss_policy.toml"
RUN_ENDS_WITHIN = 40.0
"""Seconds after the primary's death by which the run has ended."""


def fleet_on(
    topology: SentinelRedis,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    ledger: Path,
    **overrides: Any,
) -> Settings:
    """Settings of a fleet whose every Redis URL is the Sentinels', and two workers."""
    settings = make_settings(
        broker_url=topology.url,
        sentinel_master=MASTER,
        config=LOSS_POLICY,
        redelivery_margin=2.0,
        tool_modules=("tests.ledger_tools",),
        **overrides,
    )
    suffix = settings.namespace.rsplit("-", 1)[-1]
    for w in "ab":
        start_worker(
            settings,
            pool="threads",
            concurrency=12,
            name=f"tf-sentinel-{w}-{suffix}",
            extra_env={"TOOLFLEET_TEST_LEDGER": str(ledger)},
        )
    return settings


def agent_of(dispatcher: Any, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    tools = discover_tools(
        dispatcher=dispatcher, require=["ledger_charge", "ledger_touch"], wait=20
    )
    return create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )


def calls_of(each: int, seconds: float, round_: str = "") -> list[tuple[str, dict[str, Any]]]:
    calls = [("ledger_charge", {"seconds": seconds, "tag": f"{round_}c{i}"}) for i in range(each)]
    calls += [("ledger_touch", {"seconds": seconds, "tag": f"{round_}t{i}"}) for i in range(each)]
    return calls


def answers(outcome: dict[str, Any]) -> list[ToolMessage]:
    assert "error" not in outcome, repr(outcome.get("error"))
    return [m for m in outcome["state"]["messages"] if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_fleet_on_sentinels_serves_its_calls(
    mode: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Given TOOLFLEET_BROKER_URL naming three Sentinels and TOOLFLEET_SENTINEL_MASTER,
    when an agent runs, then the workers register and answer every call, and toolfleet
    status reads the fleet through the Sentinels."""
    ledger = tmp_path / "ledger.txt"
    with SentinelRedis() as topology:
        settings = fleet_on(topology, make_settings, start_worker, ledger)
        with closing(dispatcher_for(settings=settings)) as dispatcher:
            agent = agent_of(dispatcher, calls_of(2, 0.1))
            runner, outcome = run_in_thread(agent, mode)
            runner.join(timeout=60)
            messages = answers(outcome)
        assert [m.status for m in messages] == ["success"] * 4, [m.content for m in messages]
        runs = ledger_runs(ledger)
        assert set(runs["charge"].values()) == {1} and set(runs["touch"].values()) == {1}
        status = collect(settings, timeout=2.0)
        suffix = settings.namespace.rsplit("-", 1)[-1]
        assert sorted(w.name.split("@")[0] for w in status.workers) == [
            f"tf-sentinel-{w}-{suffix}" for w in "ab"
        ]
        assert all(w.active == 0 for w in status.workers)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("replica", ["in_sync", "behind"])
def test_a_failover_mid_fan_out_loses_no_call_and_doubles_no_effect(
    mode: str,
    replica: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Given a fan-out of non-idempotent and idempotent calls running on a fleet whose
    Redis is managed by three Sentinels, when the primary is killed and a replica
    promoted (one that kept up, or one whose replication was cut before the run), then
    every call is answered (a non-idempotent call may say it may have partially run), no
    non-idempotent call runs twice, the run ends within 40 s of the primary's death, and
    the next run on the new primary succeeds in full."""
    ledger = tmp_path / "ledger.txt"
    each, seconds = 3, 3.0
    with SentinelRedis() as topology:
        settings = fleet_on(topology, make_settings, start_worker, ledger)
        with closing(dispatcher_for(settings=settings)) as dispatcher:
            agent = agent_of(dispatcher, calls_of(each, seconds))
            if replica == "behind":
                topology.link.cut()  # what the run writes never reaches the replica
            runner, outcome = run_in_thread(agent, mode)
            wait_until(lambda: started_calls(settings) == 2 * each, 30, "every call's start")
            time.sleep(seconds / 3)
            died_at = time.monotonic()
            topology.kill_primary()
            topology.wait_failover()
            runner.join(timeout=RUN_ENDS_WITHIN + 30)
            took = time.monotonic() - died_at
            assert not runner.is_alive(), "the run hangs after the failover"
            messages = answers(outcome)
            app = create_app(settings)
            try:
                # A second run of a call would still be going: wait for idle workers.
                wait_until(lambda: workers_idle(app), 30, "idle workers")
            finally:
                app.close()
            runs = ledger_runs(ledger)
            errors = [m for m in messages if m.status == "error"]
            print(
                f"{replica} {mode}: charge runs {dict(runs['charge'])}, touch runs "
                f"{dict(runs['touch'])}, {len(errors)} errors, ended {took:.1f} s after the "
                "primary's death"
            )
            assert len(messages) == 2 * each, [m.content for m in messages]
            assert all(n == 1 for n in runs["charge"].values()), runs["charge"]
            assert set(runs["touch"]) == {f"t{i}" for i in range(each)}, runs["touch"]
            for message in errors:
                assert "may have partially run" in str(message.content), message.content
            assert took <= RUN_ENDS_WITHIN, took

            # The next run, on the promoted replica, succeeds in full.
            agent = agent_of(dispatcher, calls_of(each, 0.1, "next-"))
            runner, outcome = run_in_thread(agent, mode)
            runner.join(timeout=60)
            assert [m.status for m in answers(outcome)] == ["success"] * (2 * each)
            after = ledger_runs(ledger)
            assert {t: n for t, n in after["charge"].items() if t.startswith("next-")} == {
                f"next-c{i}": 1 for i in range(each)
            }
        client = redis_client(settings.own_redis_url, settings)
        try:
            assert client.ping()
        finally:
            client.close()
