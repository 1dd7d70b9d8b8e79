"""The per-loop Redis clients of async publications: one per loop, each closed by its loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from orchestrator.dispatch.loop_redis import LoopClients


class FakeClient:
    """Stands in for a ``redis.asyncio`` client: records when it is closed, and on what."""

    def __init__(self) -> None:
        self.closed_on: asyncio.AbstractEventLoop | None = None

    async def aclose(self) -> None:
        self.closed_on = asyncio.get_running_loop()


def test_each_loop_gets_a_client_of_its_own_closed_when_the_loop_shuts_down() -> None:
    """Given two loops run one after the other (two ``asyncio.run``), when each asks twice,
    then each gets one client of its own, and each client is closed on its own loop as
    that loop shuts down."""
    made: list[FakeClient] = []

    def factory() -> Any:
        made.append(FakeClient())
        return made[-1]

    clients = LoopClients(factory)

    async def ask() -> tuple[Any, Any, asyncio.AbstractEventLoop]:
        first = await clients.get()
        second = await clients.get()
        return first, second, asyncio.get_running_loop()

    a1, a2, loop_a = asyncio.run(ask())
    b1, b2, loop_b = asyncio.run(ask())

    assert a1 is a2 and b1 is b2 and a1 is not b1
    assert [c.closed_on for c in made] == [loop_a, loop_b]


def test_closing_from_another_thread_closes_the_client_of_a_running_loop() -> None:
    """Given a loop that keeps running with a client, when the clients are closed from
    another thread, then that client is closed on its loop, and no new one is handed out."""
    made: list[FakeClient] = []

    def factory() -> Any:
        made.append(FakeClient())
        return made[-1]

    clients = LoopClients(factory)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        asyncio.run_coroutine_threadsafe(clients.get(), loop).result(5)

        clients.close()

        for _ in range(100):
            if made[0].closed_on is loop:
                break
            threading.Event().wait(0.02)
        assert made[0].closed_on is loop
        with pytest.raises(RuntimeError, match="closed"):
            asyncio.run_coroutine_threadsafe(clients.get(), loop).result(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
