"""Redis restarts during a run: workers and the orchestrator reconnect, the run completes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from orchestrator.local import EmbeddedRedis
from tests.support.fleet import effects, one_turn, started_calls, wait_until
from tool_workers.settings import Settings

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_run_survives_a_redis_restart(
    mode: str,
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Given calls in flight, when the Redis server (with AOF persistence) restarts, then
    the workers and the orchestrator's result listener reconnect and the run completes with
    every result; no waiter hangs on the dead pub/sub connection."""
    with EmbeddedRedis(tmp_path / "redis", appendonly=True) as server:
        settings = fault_settings(broker_url=server.url)
        start_worker(settings, pool="threads", concurrency=8)
        start_worker(settings, pool="prefork", concurrency=2)
        dispatcher = dispatcher_for(settings=settings)
        tools = discover_tools(dispatcher=dispatcher, require=["slow_effect"], wait=15)
        calls = [("slow_effect", {"seconds": 3, "tag": f"r{i}"}) for i in range(4)]
        agent = create_agent(
            one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
        )
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                payload = {"messages": [("user", "go")]}
                outcome["state"] = (
                    agent.invoke(payload) if mode == "sync" else asyncio.run(agent.ainvoke(payload))
                )
            except BaseException as exc:
                outcome["error"] = exc

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        wait_until(lambda: started_calls(settings) == 4, 30, "the start of every call")
        server.restart(down_for=1.0)
        runner.join(timeout=90)

        assert not runner.is_alive(), "the run hangs after the restart"
        assert "error" not in outcome, repr(outcome.get("error"))
        messages = [m for m in outcome["state"]["messages"] if isinstance(m, ToolMessage)]
        assert [m.status for m in messages] == ["success"] * 4, [m.content for m in messages]
        assert outcome["state"]["messages"][-1].content == "done: 4 results"
        client = redis.Redis.from_url(server.url)
        try:
            runs = effects(client, settings, "slow_effect")
        finally:
            client.close()
        assert len(runs) == 4
        assert set(runs.values()) == {1}, runs  # nothing ran twice
