"""A TCP proxy that adds a fixed one-way delay to every byte, for slow-link tests.

``tc netem`` is not available on every kernel (it is not on the CI machines), so link
delay is added here, in user space: each chunk read from one side is written to the other
``delay`` seconds after it arrived, in order, in both directions. A round trip through
the proxy therefore costs at least ``2 * delay``. The proxy runs its own event loop in a
daemon thread and listens on the address it is given (loopback or a test network's
address) only.

It also counts what crosses it, so a benchmark can say how many round trips a call
costs: an *exchange* is a burst of bytes from the client answered by the server (a
request, or a pipeline of requests, and its reply). Bytes the server sends unasked (a
pub/sub message) end the client's turn without counting. For Redis clients the command
names of each exchange are read from the request (RESP arrays), so the count can be
broken down by what the round trip was for (``BRPOP``, ``EVALSHA``, ``ZADD+HSET``...).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import threading
import time

CHUNK = 65536

_COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n")
"""The name of a command in a RESP request (the first element of its array)."""


class Exchanges:
    """Request/reply exchanges seen by a proxy, by what they asked for."""

    def __init__(self) -> None:
        self.total = 0
        self.kinds: collections.Counter[str] = collections.Counter()

    def count(self, request: bytes) -> None:
        """One more exchange, opened by ``request`` (its first chunk)."""
        self.total += 1
        names = dict.fromkeys(m.decode().upper() for m in _COMMAND.findall(request))
        self.kinds["+".join(names) or "?"] += 1

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """The total and the counts by kind so far."""
        return self.total, dict(self.kinds)


class _Turn:
    """Whose turn it is on one connection: a client chunk after a reply opens an
    exchange; more client chunks before the reply belong to it."""

    def __init__(self) -> None:
        self.client_waiting = False


class DelayProxy:
    """Forward ``listen`` -> ``target`` with ``delay`` seconds added each way.

    Args:
        target_host: Where connections go.
        target_port: Their port there.
        delay: One-way delay in seconds (round trips cost twice this).
        listen_host: Address to listen on (a free port is picked).
    """

    def __init__(
        self, target_host: str, target_port: int, delay: float, listen_host: str = "127.0.0.1"
    ) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.listen_host = listen_host
        self.port = 0
        self.connections = 0
        self.exchanges = Exchanges()
        """Every exchange through this proxy (read them between two snapshots)."""
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url_host(self) -> str:
        """``host:port`` clients connect to."""
        return f"{self.listen_host}:{self.port}"

    def start(self) -> DelayProxy:
        """Listen and start forwarding (returns once the port is bound)."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        future.result(timeout=10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await self._connect()
        except (OSError, TimeoutError):
            writer.close()
            return
        turn = _Turn()
        for src, dst, upstream in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.ensure_future(self._pipe(src, dst, turn, upstream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the target, for one accepted connection."""
        return await asyncio.wait_for(asyncio.open_connection(*self.target), timeout=10)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, turn: _Turn, upstream: bool
    ) -> None:
        # Chunks wait in a queue with their arrival time, so the delay never reorders
        # bytes nor slows the reads down (bandwidth stays; only latency is added).
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(queue, dst))
        try:
            while True:
                data = await src.read(CHUNK)
                if data and upstream and not turn.client_waiting:
                    self.exchanges.count(data)
                turn.client_waiting = upstream
                queue.put_nowait((time.monotonic(), data))
                if not data:
                    break
        except OSError:
            queue.put_nowait((time.monotonic(), b""))
        finally:
            if not sender.done() and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes]], dst: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                arrived, data = await queue.get()
                wait = arrived + self.delay - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()

    def close(self) -> None:
        """Stop listening, drop every connection, stop the loop (bounded in time)."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
