"""``toolfleet serve`` under a burst on loopback: Redis connections are waited for, not refused.

One server whose shared Redis clients hold at most 4 connections each, over a prefork
fleet of its own. Hundreds of followers of one run and hundreds of thread searches
arrive at once: every search must answer 200, and every follower must read the run to
its end, however long they queue for a connection. Bounded in count (300 + 300) and in
time (the test's timeout).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from orchestrator.server.app import pooled_client
from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(150)

FOLLOWERS = 300
SEARCHES = 300


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    # One tenant follows with all 300: its stream cap (TOOLFLEET_TENANT_MAX_STREAMS, 100 by
    # default) raised past them, the load being the point here.
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("load"),
        "load",
        redis_pool_size=4,
        tenant_max_streams=FOLLOWERS + 10,
    )
    yield process
    process.stop()


async def follow(http: httpx.AsyncClient, path: str) -> list[str]:
    """The event names of one follower's stream, to its end."""
    events = []
    async with http.stream("GET", path) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
    return events


@pytest.mark.serial  # the load is the point: 600 connections, not the other tests' too
def test_many_followers_and_searches_at_once_all_complete(server: ServerProcess) -> None:
    """Given a run that takes about 3 s, when 300 clients follow its stream and 300
    search threads at the same moment, then all searches answer 200 and every follower
    gets the metadata, the values and the end of the run."""
    token = server.settings.api_tokens[0]

    async def scenario() -> tuple[list[int], list[list[str]], float]:
        limits = httpx.Limits(max_connections=FOLLOWERS + SEARCHES + 10)
        async with httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Bearer {token}"},
            limits=limits,
            timeout=90,
        ) as http:
            tid = (await http.post("/threads", json={"metadata": {"load": 1}})).json()["thread_id"]
            text = json.dumps({"calls": [["sleep_for", {"seconds": 1}]], "model_delay": 2})
            body = {
                "assistant_id": "agent",
                "input": {"messages": [{"role": "user", "content": text}]},
            }
            run = (await http.post(f"/threads/{tid}/runs", json=body)).json()
            path = f"/threads/{tid}/runs/{run['run_id']}/stream"
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            followers = [asyncio.create_task(follow(http, path)) for _ in range(FOLLOWERS)]
            searches = [
                asyncio.create_task(http.post("/threads/search", json={"limit": 5}))
                for _ in range(SEARCHES)
            ]
            answered = [r.status_code for r in await asyncio.gather(*searches)]
            streams = await asyncio.gather(*followers)
            return answered, streams, loop.time() - t0

    answered, streams, elapsed = asyncio.run(scenario())

    assert answered == [200] * SEARCHES
    cut = [s for s in streams if s[:1] != ["metadata"] or "values" not in s]
    assert not cut, f"{len(cut)} of {FOLLOWERS} streams cut: {cut[:3]}"
    shapes = {tuple(s) for s in streams}
    assert len(shapes) == 1, shapes
    print(f"{FOLLOWERS} followers + {SEARCHES} searches over 2x4 connections: {elapsed:.1f} s")


def test_a_burst_beyond_the_pool_waits_for_connections(redis_url: str) -> None:
    """Given the service's Redis client with a pool of 8, when 400 commands are sent at
    once, then all succeed (redis-py's default pool fails those beyond its size with
    MaxConnectionsError) over at most 8 connections."""
    name = f"tft-pool-{uuid.uuid4().hex[:8]}"
    settings = Settings(broker_url=redis_url, redis_pool_timeout=30)
    seen: list[int] = []

    async def scenario() -> list[object]:
        client = pooled_client(redis_url, settings, 8, client_name=name)
        try:
            replies = await asyncio.gather(*(client.ping() for _ in range(400)))
            watcher = redis.Redis.from_url(redis_url)
            try:
                seen.append(sum(1 for c in watcher.client_list() if c.get("name") == name))
            finally:
                watcher.close()
            return replies
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [True] * 400
    assert 0 < seen[0] <= 8
