"""What replicas tell each other: that they live, and which runs to cancel.

Each replica renews ``replica:<id>`` (a key with a TTL) while it lives, so the others
can tell a run whose replica died from one still running. Cancel requests go out on one
pub/sub channel; every replica hears them and cancels the run if it executes it. (A
request missed while a replica's subscription was down is still found: the run record
carries the request, and the owner checks it as it renews its hold on the thread.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from orchestrator.backoff import raise_if_cancelled, subscribe_forever
from orchestrator.server.keys import Keys

log = logging.getLogger("toolfleet.server")

RENEW_INTERVAL = 5.0
"""Seconds between renewals of a replica's liveness (and of a run's hold on its thread)."""

REPLICA_TTL_MS = 30_000
"""A replica that stopped renewing for this long is gone: its runs are marked failed."""


class ReplicaControl:
    """This replica's liveness and its end of the cancel channel.

    Args:
        client: A ``redis.asyncio`` client (string responses).
        keys: Key names of the deployment.
        replica_id: This replica's id.
        on_cancel: Called with the run id of every cancel request heard.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        replica_id: str,
        on_cancel: Callable[[str], object],
    ) -> None:
        self._r: Any = client
        self._keys = keys
        self.replica_id = replica_id
        self._on_cancel = on_cancel
        self._loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Announce the replica; keep announcing it and listening for cancel requests."""
        await self._announce()
        self._loops = [
            asyncio.create_task(self._renew_forever(), name="toolfleet-replica-heartbeat"),
            asyncio.create_task(self._listen_forever(), name="toolfleet-control"),
        ]

    async def close(self) -> None:
        """Stop, and say the replica is gone."""
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        with contextlib.suppress(RedisError, OSError):
            await self._r.delete(self._keys.replica(self.replica_id))

    async def request_cancel(self, run_id: str) -> None:
        """Ask every replica to cancel ``run_id``."""
        await self._r.publish(self._keys.control, run_id)

    async def alive(self, replica_id: str) -> bool:
        """Whether the replica ``replica_id`` still renews its liveness."""
        return bool(await self._r.exists(self._keys.replica(replica_id)))

    async def _announce(self) -> None:
        await self._r.set(self._keys.replica(self.replica_id), "1", px=REPLICA_TTL_MS)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(RENEW_INTERVAL)
            try:
                await self._announce()
            except (RedisError, OSError) as exc:
                raise_if_cancelled(exc)
                log.warning("could not renew replica liveness (%r)", exc)

    async def _listen_forever(self) -> None:
        await subscribe_forever(
            self._r,
            self._keys.control,
            lambda data: self._on_cancel(str(data)),
            what="control channel",
        )
