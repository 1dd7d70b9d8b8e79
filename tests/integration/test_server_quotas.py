"""``toolfleet serve`` bounds what each tenant keeps: storage quotas, kept versions.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own, with two
tenants, a storage quota of 1 MiB each and three versions kept per assistant. Each test
uses threads, items and assistants of its own and deletes them after.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(120)

A, B = (f"tft-{name}-{uuid.uuid4().hex}" for name in ("a", "b"))
QUOTA = 1_048_576
THREAD_TTL = 3_600
BIG = "x" * 300_000
"""A value of 300 kB: four of them pass the quota."""


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("quotas"),
        "quotas",
        api_tokens=(f"tenant-a:{A}", f"tenant-b:{B}"),
        tenant_max_bytes=QUOTA,
        assistant_max_versions=3,
        thread_ttl=THREAD_TTL,
    )
    yield process
    process.stop()


@pytest.fixture
def http_a(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {A}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def http_b(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {B}"}, timeout=30
    ) as client:
        yield client


def refused_for_quota(response: httpx.Response) -> bool:
    return response.status_code == 413 and "TOOLFLEET_TENANT_MAX_BYTES" in response.json()["detail"]


def test_thread_metadata_past_the_quota_is_413_and_deleting_frees_it(
    http_a: httpx.Client, http_b: httpx.Client
) -> None:
    """Given tenant A writing 300 kB of thread metadata again and again, then a write
    past 1 MiB is refused with 413 naming the quota, and nothing of it is kept; tenant B
    still writes; once A deletes a thread, A writes again."""
    threads: list[str] = []
    try:
        statuses = []
        for i in range(6):
            response = http_a.post("/threads", json={"metadata": {"blob": BIG, "n": i}})
            statuses.append(response.status_code)
            if response.status_code == 200:
                threads.append(response.json()["thread_id"])
            else:
                assert refused_for_quota(response), response.text
        assert statuses[:3] == [200, 200, 200] and 413 in statuses, statuses
        patched = http_a.patch(f"/threads/{threads[0]}", json={"metadata": {"more": BIG}})
        assert refused_for_quota(patched), patched.text
        assert "more" not in http_a.get(f"/threads/{threads[0]}").json()["metadata"]

        other = http_b.post("/threads", json={"metadata": {"blob": BIG}})
        assert other.status_code == 200
        http_b.delete(f"/threads/{other.json()['thread_id']}")

        assert http_a.delete(f"/threads/{threads.pop()}").status_code == 204
        again = http_a.post("/threads", json={"metadata": {"blob": BIG}})
        assert again.status_code == 200, again.text
        threads.append(again.json()["thread_id"])
    finally:
        for thread_id in threads:
            http_a.delete(f"/threads/{thread_id}")


def test_state_values_written_through_the_api_count(http_a: httpx.Client) -> None:
    """Given a thread of the agent's graph, when 300 kB of state values are written to it
    again and again, then a write past the quota is 413 and no checkpoint is added."""
    thread_id = http_a.post("/threads", json={"metadata": {"graph_id": "agent"}}).json()[
        "thread_id"
    ]
    try:
        statuses = []
        for _ in range(5):
            values = {"messages": [{"role": "user", "content": BIG, "id": uuid.uuid4().hex}]}
            response = http_a.post(f"/threads/{thread_id}/state", json={"values": values})
            statuses.append(response.status_code)
            if response.status_code != 200:
                assert refused_for_quota(response), response.text
        assert statuses[:3] == [200, 200, 200] and statuses[-1] == 413, statuses
        history = http_a.post(f"/threads/{thread_id}/history", json={"limit": 20}).json()
        assert len(history) == statuses.count(200)
    finally:
        http_a.delete(f"/threads/{thread_id}")


def test_store_items_past_the_quota_are_413(http_a: httpx.Client) -> None:
    keys = [f"k{i}" for i in range(5)]
    try:
        statuses = [
            http_a.put(
                "/store/items", json={"namespace": ["q"], "key": key, "value": {"v": BIG}}
            ).status_code
            for key in keys
        ]
        assert statuses[:3] == [204, 204, 204] and statuses[-1] == 413, statuses
        # Replacing an item by one no bigger is fine at the quota.
        same = http_a.put("/store/items", json={"namespace": ["q"], "key": "k0", "value": {}})
        assert same.status_code == 204
        params = {"namespace": "q", "key": keys[-1]}
        assert http_a.get("/store/items", params=params).json() is None
    finally:
        for key in keys:
            http_a.request("DELETE", "/store/items", json={"namespace": ["q"], "key": key})


def test_assistants_keep_few_versions_expire_and_count(
    server: ServerProcess, http_a: httpx.Client, redis_url: str
) -> None:
    """Given an assistant changed ten times, then it lists its three newest versions, its
    keys expire within the thread TTL, and big versions meet the quota."""
    assistant_id = http_a.post("/assistants", json={"graph_id": "agent"}).json()["assistant_id"]
    try:
        for i in range(10):
            patched = http_a.patch(f"/assistants/{assistant_id}", json={"metadata": {"n": i}})
            assert patched.status_code == 200
        versions = http_a.post(f"/assistants/{assistant_id}/versions", json={"limit": 100})
        assert [v["version"] for v in versions.json()] == [11, 10, 9]

        prefix = f"{server.settings.key_prefix}server:"
        r = redis.Redis.from_url(redis_url)
        try:
            ttls = {k.decode(): r.ttl(k) for k in r.scan_iter(f"{prefix}assistant*")}
        finally:
            r.close()
        assert any(assistant_id in k for k in ttls)
        assert all(0 < ttl <= THREAD_TTL for ttl in ttls.values()), ttls

        statuses = [
            http_a.patch(
                f"/assistants/{assistant_id}", json={"metadata": {"blob": BIG, "n": i}}
            ).status_code
            for i in range(6)
        ]
        assert 413 in statuses, statuses
    finally:
        http_a.delete(f"/assistants/{assistant_id}")


def test_usage_shows_in_metrics_under_a_hash_never_the_tenant(
    server: ServerProcess, http_a: httpx.Client
) -> None:
    thread_id = http_a.post("/threads", json={"metadata": {"blob": BIG}}).json()["thread_id"]
    try:
        text = httpx.get(f"{server.url}/metrics").text
        usage: dict[str, float] = {}
        for label, value in re.findall(
            r'^toolfleet_server_tenant_storage_bytes\{tenant_hash="([0-9a-f]{12})"\} (\S+)$',
            text,
            re.M,
        ):
            usage[label] = float(value)
        assert usage and max(usage.values()) >= len(BIG), text
        assert "tenant-a" not in text and "tenant-b" not in text
        most = re.search(r"^toolfleet_server_tenant_storage_max_bytes (\S+)$", text, re.M)
        assert most is not None and float(most.group(1)) == QUOTA
    finally:
        http_a.delete(f"/threads/{thread_id}")
