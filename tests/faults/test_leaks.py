"""After runs end — finished, failed, cancelled — nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
import redis
from langchain.agents import create_agent

from orchestrator import (
    CeleryToolMiddleware,
    RunDeadlineExceeded,
    discover_tools,
    dispatcher_for,
    with_deadline,
)
from orchestrator.dispatch.fleet import close_all
from tests.support.fleet import one_turn, started_calls
from tool_workers.contract.epoch import epoch_key
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def test_no_subscriptions_futures_or_unexpiring_keys_remain(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given sync, async, failing, timed-out and cancelled runs, when they are over, then
    the orchestrator holds no result subscription or pending future, and every Redis key
    the runs created expires (only kombu's queue bindings and the namespace's epoch, one
    small key each, are permanent)."""
    settings = fault_settings()
    start_worker(settings, pool="prefork", concurrency=4)
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["sleep_for", "boom"], wait=15)

    def agent(calls: list[tuple[str, dict[str, Any]]]) -> Any:
        return create_agent(
            one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
        )

    payload = {"messages": [("user", "go")]}
    fan_out = [("sleep_for", {"seconds": 0.1, "label": str(i)}) for i in range(20)]
    agent(fan_out).invoke(payload)
    asyncio.run(agent(fan_out).ainvoke(payload))
    agent([("boom", {"reason": "x"}), ("no_such_tool", {})]).invoke(payload)
    with contextlib.suppress(RunDeadlineExceeded):
        agent([("sleep_for", {"seconds": 3})] * 3).invoke(payload, with_deadline(0.5))

    async def cancelled() -> None:
        before = await asyncio.to_thread(started_calls, settings)
        task = asyncio.ensure_future(agent([("sleep_for", {"seconds": 3})] * 3).ainvoke(payload))
        while await asyncio.to_thread(started_calls, settings) < before + 3:  # all running
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())

    assert dispatcher.in_flight() == 0
    assert dispatcher.listener.pending() == 0
    assert dispatcher.listener.subscribed == {dispatcher.listener.reply_channel}
    client = redis.Redis.from_url(settings.broker_url)
    try:
        # kombu's ledger of unacknowledged messages empties (and so vanishes) once the
        # workers have acknowledged the revoked calls; give them a moment.
        deadline = time.monotonic() + 10
        while True:
            keys = list(client.scan_iter(match=f"{settings.namespace}:*", count=1000))
            lasting = [
                k
                for k in keys
                if client.ttl(k) == -1
                and b"_kombu.binding" not in k
                and k.decode() != epoch_key(settings.key_prefix)
            ]
            if not lasting or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        client.close()
    assert keys
    assert lasting == []


def _connections_to(port: int) -> set[tuple[str, int]]:
    """This process's open TCP connections to ``port`` (their local addresses)."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    }


def test_closing_the_dispatchers_closes_every_connection_they_opened(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a process-wide dispatcher that published and waited on sync and async calls,
    when the dispatchers are closed, then none of the connections it opened (registry,
    results, its Celery app's broker pool) is left open for the garbage collector."""
    settings = fault_settings()
    start_worker(settings, pool="threads", concurrency=4)
    port = int(settings.broker_url.rsplit(":", 1)[1].split("/")[0])
    before = _connections_to(port)
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["sleep_for"], wait=15)
    fan_out = [("sleep_for", {"seconds": 0.1, "label": str(i)}) for i in range(4)]
    agent = create_agent(
        one_turn(fan_out), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    agent.invoke({"messages": [("user", "go")]})
    assert _connections_to(port) - before, "the dispatcher opened no connection"

    close_all()

    assert _connections_to(port) - before == set()
