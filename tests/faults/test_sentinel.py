"""A fleet on a Sentinel-managed Redis: it serves, and a failover mid fan-out loses no
call and runs no non-idempotent call twice.

Each test starts its own primary, replica and three Sentinels (tests.support.sentinel:
the embedded server's binary, on free loopback ports). Side effects are counted outside
Redis, in the ledger file of :mod:`tests.ledger_tools`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from flower.utils.broker import Broker
from langgraph_sdk import get_client

from orchestrator import dispatcher_for
from orchestrator.cli.status import collect
from tests.support.fleet import ledger_runs, run_in_thread, wait_until
from tests.support.sentinel import (
    SentinelRedis,
    agent_of,
    answers,
    calls_of,
    failover_mid_fan_out,
    fleet_on,
)
from tests.support.serving import run, start_server
from tool_workers.contract.broker import create_app
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_fleet_on_sentinels_serves_its_calls(
    mode: str,
    broker: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Given TOOLFLEET_BROKER_URL naming three Sentinels (or RabbitMQ carrying the calls
    and TOOLFLEET_REDIS_URL naming the Sentinels) and TOOLFLEET_SENTINEL_MASTER,
    when an agent runs, then the workers register and answer every call, and toolfleet
    status reads the fleet through the Sentinels."""
    ledger = tmp_path / "ledger.txt"
    with SentinelRedis() as topology:
        settings = fleet_on(topology, make_settings, start_worker, ledger, broker, request)
        with closing(dispatcher_for(settings=settings)) as dispatcher:
            agent = agent_of(dispatcher, calls_of(2, 0.1))
            runner, outcome = run_in_thread(agent, mode)
            runner.join(timeout=60)
            messages = answers(outcome)
        assert [m.status for m in messages] == ["success"] * 4, [m.content for m in messages]
        runs = ledger_runs(ledger)
        assert set(runs["charge"].values()) == {1} and set(runs["touch"].values()) == {1}

        # A worker may still count its last call active for a moment after its result
        # (or answer inspect late on a busy machine): read again until it is idle.
        def idle() -> Any:
            status = collect(settings, timeout=2.0)
            return status if all(w.active == 0 for w in status.workers) else None

        status = wait_until(idle, 20, "the fleet's workers idle")
        suffix = settings.namespace.rsplit("-", 1)[-1]
        assert sorted(w.name.split("@")[0] for w in status.workers) == [
            f"tf-sentinel-{w}-{suffix}" for w in "ab"
        ]
        assert all(w.active == 0 for w in status.workers), status.workers
        if broker == "redis":
            # Flower's broker view (its queue lengths) reads them through the Sentinels.
            app = create_app(settings)
            try:
                with app.connection() as connection:
                    uri = connection.as_uri(include_password=True)
                flower_broker = Broker(
                    uri,
                    http_api=None,
                    broker_options=app.conf.broker_transport_options,
                    broker_use_ssl=app.conf.broker_use_ssl,
                )

                async def queues() -> Any:
                    try:
                        return await flower_broker.queues(["tools"])
                    finally:  # its clients, the primary's and the Sentinels'
                        await flower_broker.redis.aclose()
                        for (
                            sentinel
                        ) in flower_broker.redis.connection_pool.sentinel_manager.sentinels:
                            await sentinel.aclose()

                assert run(queues()) == [{"name": "tools", "messages": 0}]
            finally:
                app.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failover_mid_fan_out_loses_no_call_and_doubles_no_effect(
    mode: str,
    broker: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Given a fan-out of non-idempotent and idempotent calls running on a fleet whose
    Redis is managed by three Sentinels, when the primary is killed and its replica (in
    sync) promoted, then every call is answered, no non-idempotent call runs twice, the
    run ends within 40 s of the primary's death, and the next run succeeds in full."""
    failover_mid_fan_out(mode, "in_sync", broker, make_settings, start_worker, tmp_path, request)


def test_serve_on_sentinels_follows_a_failover_without_a_restart(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Given toolfleet serve and its workers on three Sentinels, when a run is waited
    for, the primary killed and another run waited for, then both runs answer in full
    through the same server process (its pools find the new primary)."""
    ledger = tmp_path / "ledger.txt"
    with SentinelRedis() as topology:
        settings = fleet_on(topology, make_settings, start_worker, ledger, "redis", request)
        server = start_server(settings, tmp_path, "serve-sentinel")
        try:

            async def wait_for(tag: str) -> Any:
                async with get_client(url=server.url, api_key=server.settings.api_tokens[0]) as c:
                    thread = await c.threads.create()
                    text = json.dumps({"calls": [["ledger_touch", {"seconds": 0.1, "tag": tag}]]})
                    return await c.runs.wait(
                        thread["thread_id"],
                        "agent",
                        input={"messages": [{"role": "user", "content": text}]},
                    )

            before = run(wait_for("before"))
            topology.kill_primary()
            topology.wait_failover()
            after = run(wait_for("after"))
        finally:
            server.stop()
    assert before["messages"][-1]["content"] == "done: 1 results: touched before"
    assert after["messages"][-1]["content"] == "done: 1 results: touched after"
    assert ledger_runs(ledger)["touch"] == {"before": 1, "after": 1}
