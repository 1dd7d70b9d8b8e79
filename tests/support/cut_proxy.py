"""A loopback TCP proxy that can go down and come back, standing in for a broker restart.

The machine's RabbitMQ cannot be restarted by a test (other runs use it). Seen from the
workers and the orchestrator, a restart is every connection dropped, new ones refused
for a while, then accepted again, the durable queues and their messages still there:
that is what :meth:`CutProxy.outage` does in front of the real server.
"""

from __future__ import annotations

import asyncio
import time

from orchestrator.bench.delay_proxy import DelayProxy


class CutProxy(DelayProxy):
    """Forward ``listen`` -> ``target`` with no delay; :meth:`outage` drops everything."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port, delay=0.0)
        self.down = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.close()  # refused, as by a server that is not there
            return
        await super()._accept(reader, writer)

    def cut(self) -> None:
        """Drop every connection and refuse new ones until :meth:`heal`."""

        async def cut() -> None:
            self.down = True
            for task in list(self._tasks):
                task.cancel()

        asyncio.run_coroutine_threadsafe(cut(), self._loop).result(timeout=10)

    def heal(self) -> None:
        """Accept connections again."""
        self.down = False

    def retarget(self, host: str, port: int) -> None:
        """Forward to ``host:port`` from now on; every connection to the old target is
        dropped (clients reconnect, as to a failover's new primary)."""
        self.target = (host, port)
        self.cut()
        self.heal()

    def outage(self, down_for: float) -> None:
        """Drop every connection, refuse new ones for ``down_for`` seconds, then accept."""

        async def cut() -> None:
            self.down = True
            for task in list(self._tasks):
                task.cancel()

        asyncio.run_coroutine_threadsafe(cut(), self._loop).result(timeout=10)
        time.sleep(down_for)
        self.down = False


class BalancingProxy(DelayProxy):
    """A load balancer in front of replicas: each connection goes to the next of
    ``targets`` in turn, and to the one after it when that one refuses (a replica that
    was killed or stopped listening)."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        super().__init__(*targets[0], delay=0.0)
        self.targets = targets
        self._turn = 0

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        last: OSError | None = None
        for _ in self.targets:
            self._turn = (self._turn + 1) % len(self.targets)
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(*self.targets[self._turn]), timeout=10
                )
            except OSError as exc:
                last = exc
        raise last or OSError("no target")
