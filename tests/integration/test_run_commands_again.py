"""A run's commands to Redis are safe to send again after a lost link: its stream parts
are written once, its admission to its thread answered alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator.server.eventlog import EventLog
from orchestrator.server.keys import Keys
from orchestrator.server.store import Store
from tests.support.fleet import new_namespace


class Flaky:
    """A client whose pipelines' first ``fails`` executions lose the link: before Redis
    applied them, or (``applied``) after."""

    def __init__(self, client: aioredis.Redis, fails: int, *, applied: bool) -> None:
        self._client = client
        self.fails = fails
        self.applied = applied

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def pipeline(self, **kwargs: Any) -> Any:
        real, flaky = self._client.pipeline(**kwargs), self

        class Pipe:
            async def __aenter__(self) -> Any:
                await real.__aenter__()
                return self

            async def __aexit__(self, *exc: object) -> None:
                await real.__aexit__(*exc)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            async def execute(self) -> Any:
                if flaky.fails <= 0:
                    return await real.execute()
                flaky.fails -= 1
                if flaky.applied:
                    await real.execute()
                else:
                    await real.reset()
                raise RedisConnectionError("Connection reset by peer")

        return Pipe()


def entries(redis_url: str, fails: int, *, applied: bool, retry_for: float = 5.0) -> Any:
    async def go() -> Any:
        client = aioredis.Redis.from_url(redis_url)
        keys = Keys(f"{new_namespace()}:toolfleet:")
        try:
            log = EventLog(Flaky(client, fails, applied=applied), keys, 60, retry_for)  # type: ignore[arg-type]
            await log.append("r1", "values", b'{"n": 1}')
            await log.append("r1", "values", b'{"n": 1}')  # the same part again: a new entry
            return await client.xrange(keys.events("r1")), await client.ttl(keys.events("r1"))
        finally:
            await client.delete(keys.events("r1"))
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("fails", "applied"),
    [(2, False), (1, True)],
    ids=["lost-before-redis-applied-them", "applied-but-the-answer-lost"],
)
def test_given_writes_lost_then_each_part_is_written_once(
    redis_url: str, fails: int, applied: bool
) -> None:
    """Tries after a lost one write the part only if the lost one did not."""
    written, ttl = entries(redis_url, fails, applied=applied)

    assert [fields[b"d"] for _, fields in written] == [b'{"n": 1}', b'{"n": 1}']
    assert 0 < ttl <= 60


def test_given_a_link_lost_for_longer_than_the_retry_bound_then_the_append_fails(
    redis_url: str,
) -> None:
    with pytest.raises(RedisConnectionError):
        entries(redis_url, 1000, applied=False, retry_for=0.5)


def test_given_a_run_admitted_then_asking_again_admits_it_and_keeps_the_line(
    redis_url: str,
) -> None:
    """A run's admission is sent again after a lost answer: the run that holds the
    thread is let in again, and the run waiting behind it keeps its place (before: the
    second ask was refused, and the run waited behind the next in line)."""

    async def go() -> tuple[bool, bool, bool, list[str]]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        keys = Keys(f"{new_namespace()}:toolfleet:")
        store = Store(client, keys, run_ttl=60, thread_ttl=60)
        try:
            await store.enqueue("t1", "r1")
            await store.enqueue("t1", "r2")
            first = await store.admit("t1", "r1")
            again = await store.admit("t1", "r1")
            other = await store.admit("t1", "r2")
            return first, again, other, await client.lrange(keys.thread_queue("t1"), 0, -1)
        finally:
            stale = [k async for k in client.scan_iter(f"{keys.base}*")]
            if stale:
                await client.delete(*stale)
            await client.aclose()

    assert asyncio.run(go()) == (True, True, False, ["r2"])
