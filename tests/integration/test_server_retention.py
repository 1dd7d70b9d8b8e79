"""``toolfleet serve`` leaves nothing in Redis for ever, and is quiet when idle.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own, with a
thread retention of an hour and a run retention of ten minutes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(120)

THREAD_TTL = 3_600
RUN_TTL = 600


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("retention"),
        "retention",
        thread_ttl=THREAD_TTL,
        run_ttl=RUN_TTL,
    )
    yield process
    process.stop()


def test_idle_server_does_not_report_redis_lost(server: ServerProcess) -> None:
    """Given a server with no follower, when it idles through several blocking reads of
    its event relay, then it logs no lost Redis."""
    time.sleep(12)  # the relay blocks 5 s a read
    assert "event relay lost Redis" not in server.log()


def test_every_key_of_the_service_expires(server: ServerProcess, redis_url: str) -> None:
    """Given threads with finished, queued and stateless runs, then every Redis key of
    the service has a TTL (threads' within the thread retention), except the tenant key."""
    token = server.settings.api_tokens[0]
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as http:
        tid = http.post("/threads", json={"metadata": {"kept": "a while"}}).json()["thread_id"]
        body = {"assistant_id": "agent", "input": {"messages": "hi"}}
        http.post(f"/threads/{tid}/runs/wait", json=body)
        queued = http.post(
            f"/threads/{tid}/runs", json={**body, "multitask_strategy": "enqueue"}
        ).json()
        http.get(f"/threads/{tid}/runs/{queued['run_id']}/join")
        http.post("/runs/wait", json={**body, "on_completion": "keep"})
        http.post("/threads/search", json={"metadata": {"kept": "a while"}})

    prefix = f"{server.settings.key_prefix}server:"
    r = redis.Redis.from_url(redis_url)
    try:
        ttls = {k.decode(): r.ttl(k) for k in r.scan_iter(f"{prefix}*")}
    finally:
        r.close()
    forever = {k for k, ttl in ttls.items() if ttl < 0} - {f"{prefix}tenant-key"}
    assert not forever, forever
    threads = {k: ttl for k, ttl in ttls.items() if k.startswith(f"{prefix}thread")}
    assert any(k.startswith(f"{prefix}threads:") for k in threads)
    assert all(0 < ttl <= THREAD_TTL for ttl in threads.values())
    runs = {k: ttl for k, ttl in ttls.items() if k.startswith(f"{prefix}run:")}
    assert len(runs) == 3 and all(0 < ttl <= RUN_TTL for ttl in runs.values())
