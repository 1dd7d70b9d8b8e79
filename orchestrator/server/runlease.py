"""Run leases: which replica executes each unfinished run, for how long without renewing.

Every run is leased to the replica that executes it from the moment it is created
(queued runs too) until it ends. The replica renews its runs' leases every
:data:`LEASE_RENEW` seconds in one script; a lease not renewed for :data:`LEASE_TTL_MS`
has lapsed (its replica was killed, lost its network, or handed the run on while
draining), and any other replica with room claims it and resumes the run from its
checkpoint (:meth:`~orchestrator.server.runner.RunManager.take_over`).

Two keys hold it all::

    server:run-leases   zset   run id -> when its lease lapses (ms, Redis's clock)
    server:run-owners   hash   run id -> the replica that holds its lease

Every change is one script that reads the owner first, so a lease is fenced: a replica
back from a cut finds its runs taken (:meth:`RunLeases.renew` answers them) and stops
them without writing anything; only the lease's holder renews, hands back or drops it.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from orchestrator.server.keys import Keys

LEASE_RENEW = 2.0
"""Seconds between renewals of a replica's run leases, and between its looks for lapsed
ones."""

LEASE_TTL_MS = 10_000
"""A run lease not renewed for this long has lapsed: another replica takes the run over."""

LEASE_SELF_STOP = 0.8
"""The share of its lease's time after which a replica that could not renew it stops
the run itself (before it lapses and another replica takes the run over); until then a
run goes on through a lost link to Redis, trying its writes again."""

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_TAKE = (
    _NOW
    + """
-- KEYS: leases, owners. ARGV: ttl ms, replica, run id...
for i = 3, #ARGV do
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[2])
end
return #ARGV - 2
"""
)

_RENEW = (
    _NOW
    + """
-- KEYS: leases, owners. ARGV: ttl ms, replica, run id... Returns the ids it lost.
local lost = {}
for i = 3, #ARGV do
    if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[2] then
        redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
    else
        table.insert(lost, ARGV[i])
    end
end
return lost
"""
)

_CLAIM = (
    _NOW
    + """
-- KEYS: leases, owners. ARGV: ttl ms, replica, most. Returns {run id, former owner}...
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local claimed = {}
for _, run in ipairs(lapsed) do
    local former = redis.call('HGET', KEYS[2], run) or ''
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), run)
    redis.call('HSET', KEYS[2], run, ARGV[2])
    table.insert(claimed, run)
    table.insert(claimed, former)
end
return claimed
"""
)

_IF_OWNER = """
-- KEYS: leases, owners. ARGV: replica, 'drop' | 'lapse', run id...
local n = 0
for i = 3, #ARGV do
    if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
        if ARGV[2] == 'drop' then
            redis.call('ZREM', KEYS[1], ARGV[i])
            redis.call('HDEL', KEYS[2], ARGV[i])
        else
            redis.call('ZADD', KEYS[1], 0, ARGV[i])
        end
        n = n + 1
    end
end
return n
"""


class RunLeases:
    """This replica's end of the run leases.

    Args:
        client: A ``redis.asyncio`` client (string responses).
        keys: Key names of the deployment.
        replica_id: This replica's id.
        ttl_ms: How long a lease lasts unrenewed.
    """

    def __init__(
        self, client: aioredis.Redis, keys: Keys, replica_id: str, ttl_ms: int = LEASE_TTL_MS
    ) -> None:
        self._r: Any = client
        self._keys = [keys.run_leases, keys.run_owners]
        self.replica_id = replica_id
        self.ttl_ms = ttl_ms
        self._take = client.register_script(_TAKE)
        self._renew = client.register_script(_RENEW)
        self._claim = client.register_script(_CLAIM)
        self._if_owner = client.register_script(_IF_OWNER)

    @property
    def self_stop(self) -> float:
        """Seconds without a renewal after which this replica stops its runs itself."""
        return LEASE_SELF_STOP * self.ttl_ms / 1000

    async def take(self, run_id: str) -> None:
        """Lease a new run to this replica."""
        await self._take(keys=self._keys, args=[self.ttl_ms, self.replica_id, run_id])

    async def renew(self, run_ids: list[str]) -> list[str]:
        """Renew these runs' leases; returns those another replica holds now."""
        if not run_ids:
            return []
        lost: list[str] = await self._renew(
            keys=self._keys, args=[self.ttl_ms, self.replica_id, *run_ids]
        )
        return lost

    async def claim(self, most: int) -> list[tuple[str, str]]:
        """Take up to ``most`` lapsed leases; returns ``(run id, former owner)`` of each."""
        if most <= 0:
            return []
        flat: list[str] = await self._claim(
            keys=self._keys, args=[self.ttl_ms, self.replica_id, most]
        )
        return list(zip(flat[::2], flat[1::2], strict=True))

    async def drop(self, run_id: str) -> bool:
        """Forget the lease of a run that ended here (``False``: another replica holds it)."""
        return bool(await self._if_owner(keys=self._keys, args=[self.replica_id, "drop", run_id]))

    async def hand_back(self, run_ids: list[str]) -> int:
        """Let these runs' leases lapse now: another replica takes them at its next look."""
        if not run_ids:
            return 0
        n: int = await self._if_owner(keys=self._keys, args=[self.replica_id, "lapse", *run_ids])
        return n

    async def holder(self, run_id: str) -> str | None:
        """The replica whose lease on the run has not lapsed (``None``: none has)."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.zscore(self._keys[0], run_id)
            pipe.hget(self._keys[1], run_id)
            pipe.time()
            until, owner, (seconds, micros) = await pipe.execute()
        if until is None or owner is None:
            return None
        return str(owner) if until > seconds * 1000 + micros // 1000 else None

    async def leased(self, run_id: str) -> bool:
        """Whether the run has a lease, lapsed or not (an unfinished run always has)."""
        return await self._r.zscore(self._keys[0], run_id) is not None
