"""A cancellation that a Redis call turns into a Redis error still stops a service loop.

redis-py can end a command that is cancelled mid-read with its own ``TimeoutError`` or
``ConnectionError`` instead of ``CancelledError``. A loop that retries on Redis errors
then takes the cancellation for a lost connection and goes on, and whoever awaits it on
shutdown waits for ever (seen as a service's shutdown hanging past its 180 s bound).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from orchestrator.server.eventlog import EventRelay
from orchestrator.server.keys import Keys


class _SwallowingClient:
    """A blocking read that answers its first cancellation with a Redis timeout."""

    def __init__(self) -> None:
        self.reads = 0
        self.reading = asyncio.Event()

    async def xread(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        self.reading.set()
        try:
            await asyncio.Event().wait()  # blocks until cancelled
        except asyncio.CancelledError:
            if self.reads > 1:
                raise  # only the first (else a loop that misses it would run for ever)
            raise RedisTimeoutError("Timeout reading from socket") from None

    async def delete(self, *keys: str) -> int:
        return 0


def test_given_a_read_that_turns_its_cancellation_into_a_timeout_then_the_relay_still_closes() -> (
    None
):
    """Given the relay blocked in its read, when it is closed and the read answers the
    cancellation with a Redis timeout, then the relay stops (within 5 s) and reads no
    more (it went on reading, and its close never returned)."""

    async def scenario() -> int:
        client = _SwallowingClient()  # its event belongs to this loop
        relay = EventRelay(client, client, Keys("test-swallowed:"), "replica-1")  # type: ignore[arg-type]
        await relay.start()
        await asyncio.wait_for(client.reading.wait(), timeout=5)
        await asyncio.wait_for(relay.close(), timeout=5)
        return client.reads

    reads = asyncio.run(scenario())

    assert reads == 1
