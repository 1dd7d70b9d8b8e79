"""Run leases against a real Redis: taken, renewed, lapsed, claimed once, fenced."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from orchestrator.server.keys import Keys
from orchestrator.server.runlease import RunLeases
from tests.support.fleet import new_namespace


def on_redis(redis_url: str, scenario: Callable[[aioredis.Redis, Keys], Awaitable[None]]) -> None:
    """Run ``scenario`` with a client and key names of its own; delete its keys after."""

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        keys = Keys(new_namespace())
        try:
            await scenario(client, keys)
        finally:
            await client.delete(keys.run_leases, keys.run_owners)
            await client.aclose()

    asyncio.run(main())


def test_a_lapsed_lease_is_claimed_by_one_replica_and_the_former_owner_is_fenced(
    redis_url: str,
) -> None:
    """Given a run leased to replica A for 2 s, when A stops renewing, then B and C
    claim at once and exactly one of them gets it (naming A); A's next renewal answers
    the run as lost, and A can neither drop nor hand back the lease it lost."""

    async def scenario(client: aioredis.Redis, keys: Keys) -> None:
        a, b, c = (RunLeases(client, keys, name, ttl_ms=2_000) for name in ("a", "b", "c"))
        run = str(uuid.uuid4())
        await a.take(run)
        assert await a.renew([run]) == []
        assert await b.claim(10) == []  # not lapsed
        assert await b.holder(run) == "a"
        lapses = asyncio.get_running_loop().time() + 10
        while await b.holder(run) is not None and asyncio.get_running_loop().time() < lapses:
            await asyncio.sleep(0.05)
        assert await b.holder(run) is None  # lapsed: nobody holds it
        claims = await asyncio.gather(b.claim(10), c.claim(10))
        assert sorted(claims, key=len) == [[], [(run, "a")]]
        winner = b if claims[0] else c
        assert await a.renew([run]) == [run]
        assert not await a.drop(run)
        assert await a.hand_back([run]) == 0
        assert await b.holder(run) == winner.replica_id

    on_redis(redis_url, scenario)


def test_a_handed_back_lease_is_claimed_at_once_and_a_dropped_one_never(
    redis_url: str,
) -> None:
    """Given two runs leased to A for a minute, when A hands one back and drops the
    other (it ended), then B claims the first at its next look and never the second,
    and a claim takes no more than it is asked to."""

    async def scenario(client: aioredis.Redis, keys: Keys) -> None:
        a, b = RunLeases(client, keys, "a", ttl_ms=60_000), RunLeases(client, keys, "b")
        handed, ended, third = (str(uuid.uuid4()) for _ in range(3))
        for run in (handed, ended, third):
            await a.take(run)
        assert await a.hand_back([handed, third]) == 2
        assert await a.drop(ended)
        assert not await b.leased(ended)
        assert len(await b.claim(1)) == 1  # as many as it has room for
        assert len(await b.claim(10)) == 1
        assert await b.claim(10) == []
        assert await a.renew([handed, third]) == [handed, third]

    on_redis(redis_url, scenario)
