"""The broker restarts during a run: workers and the orchestrator reconnect, the run completes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from orchestrator.local import EmbeddedRedis
from tests.support.amqp import AMQP_NAMESPACES
from tests.support.cut_proxy import CutProxy
from tests.support.fleet import (
    effects,
    new_namespace,
    one_turn,
    run_in_thread,
    started_calls,
    wait_until,
    workers_idle,
)
from tool_workers.contract.broker import create_app
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def restartable_broker(
    broker: str, request: pytest.FixtureRequest, redis_url: str, tmp_path: Path
) -> Iterator[tuple[dict[str, Any], Callable[[], None], dict[str, Any]]]:
    """Settings overrides for a broker the test can restart, the restart, and overrides
    reaching the broker past any proxy.

    Redis: an embedded server with AOF persistence, restarted for real. RabbitMQ: the
    machine's server behind a :class:`CutProxy` (it cannot be restarted here), every
    connection dropped and refused for a second; its durable queues stay.
    """
    if broker == "redis":
        with EmbeddedRedis(tmp_path / "redis", appendonly=True) as server:
            yield {"broker_url": server.url}, lambda: server.restart(down_for=1.0), {}
        return
    url = urlsplit(request.getfixturevalue("amqp_url"))
    namespace = new_namespace()
    AMQP_NAMESPACES.append(namespace)
    with CutProxy(url.hostname or "127.0.0.1", url.port or 5672) as proxy:
        proxied = url._replace(netloc=f"{url.username}:{url.password}@{proxy.url_host}")
        # Its queues are deleted when the session ends, after the workers stopped.
        yield (
            {
                "broker_url": urlunsplit(proxied),
                "result_backend": redis_url,
                "namespace": namespace,
            },
            lambda: proxy.outage(1.0),
            {"broker_url": url.geturl()},  # the test's own look, past the proxy
        )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_run_survives_a_broker_restart(
    mode: str,
    broker: str,
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    request: pytest.FixtureRequest,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """Given calls in flight, when the broker restarts (Redis with AOF persistence, or
    RabbitMQ), then the workers and the orchestrator's result listener reconnect and the
    run completes with every result; no waiter hangs on a dead connection."""
    with restartable_broker(broker, request, redis_url, tmp_path) as (
        overrides,
        restart,
        direct,
    ):
        settings = fault_settings(**overrides)
        start_worker(settings, pool="threads", concurrency=8)
        start_worker(settings, pool="prefork", concurrency=2)
        dispatcher = dispatcher_for(settings=settings)
        tools = discover_tools(dispatcher=dispatcher, require=["slow_effect"], wait=15)
        calls = [("slow_effect", {"seconds": 3, "tag": f"r{i}"}) for i in range(4)]
        agent = create_agent(
            one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
        )
        runner, outcome = run_in_thread(agent, mode)
        wait_until(lambda: started_calls(settings) == 4, 30, "the start of every call")
        restart()
        runner.join(timeout=90)
        # A second run of a call would still be going: wait until the workers are idle.
        app = create_app(settings.model_copy(update=direct))
        try:
            wait_until(lambda: workers_idle(app), 30, "idle workers")
        finally:
            app.close()

        assert not runner.is_alive(), "the run hangs after the restart"
        assert "error" not in outcome, repr(outcome.get("error"))
        messages = [m for m in outcome["state"]["messages"] if isinstance(m, ToolMessage)]
        assert [m.status for m in messages] == ["success"] * 4, [m.content for m in messages]
        assert outcome["state"]["messages"][-1].content == "done: 4 results"
        client = redis.Redis.from_url(settings.own_redis_url)
        try:
            runs = effects(client, settings, "slow_effect")
        finally:
            client.close()
        assert len(runs) == 4
        if broker == "redis":
            assert set(runs.values()) == {1}, runs  # nothing ran twice
        else:
            # RabbitMQ gives back every call of a closed connection. A worker handed its
            # own running call again drops the copy; a copy handed to another worker
            # runs again (the tool is idempotent): at most twice.
            assert set(runs.values()) <= {1, 2}, runs
            print(f"rabbitmq: {sum(n == 2 for n in runs.values())} of 4 calls ran twice")
