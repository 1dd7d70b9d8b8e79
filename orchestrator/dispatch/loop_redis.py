"""A ``redis.asyncio`` client per event loop, closed when its loop shuts down.

An asyncio connection belongs to the loop it was opened on, and a dispatcher serves
every loop of its process (a server's, each ``asyncio.run`` of a script or a test), so
async callers get a client of their running loop's own. Each client is closed by the
loop itself as it shuts down: it is held by an async generator started on that loop,
and ``asyncio.run``, ``asyncio.Runner`` and uvicorn close every such generator
(``loop.shutdown_asyncgens()``) before they close the loop. A loop closed without that
step leaves its client's connection to the garbage collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis


@dataclass
class _Held:
    client: aioredis.Redis
    keeper: AsyncGenerator[None, None]
    """The async generator that closes ``client`` when the loop shuts it down."""


async def _keep(client: aioredis.Redis) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.aclose()


class LoopClients:
    """Hands each running event loop a client of its own (thread-safe)."""

    def __init__(self, factory: Callable[[], aioredis.Redis]) -> None:
        """
        Args:
            factory: Makes a client (it connects on first use, on the loop that uses it).
        """
        self._factory = factory
        self._lock = threading.Lock()
        self._held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Held] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()

    async def get(self) -> aioredis.Redis:
        """The running loop's client.

        Raises:
            RuntimeError: after :meth:`close`.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            held = self._held.get(loop)
        if held is not None:
            return held.client
        if self._closed:
            raise RuntimeError("the dispatcher is closed")
        client = self._factory()
        keeper = _keep(client)
        # Started here, on its loop: the loop now closes it at shutdown.
        await keeper.__anext__()
        with self._lock:
            self._held[loop] = _Held(client, keeper)
        return client

    def close(self) -> None:
        """Close every client whose loop still runs (from any thread, without waiting
        for a loop other than the caller's)."""
        with self._lock:
            self._closed = True
            held = list(self._held.items())
            self._held.clear()
        for loop, entry in held:
            if loop.is_closed():
                continue
            with contextlib.suppress(RuntimeError):  # closed meanwhile: it closed it
                loop.call_soon_threadsafe(self._close_on_loop, entry)

    def _close_on_loop(self, entry: _Held) -> None:
        # On the client's loop: closing the generator closes the client.
        task = asyncio.ensure_future(entry.keeper.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
