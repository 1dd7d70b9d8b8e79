"""``toolfleet serve`` and values its schema once admitted but could not store: 422, no trace.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own. Each
request here is refused with a 422 that names the field, and leaves no record behind:
the set of the service's Redis keys is the same after them as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(prefork_fleet, tmp_path_factory.mktemp("validation"), "validation")
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    token = server.settings.api_tokens[0]
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def server_keys(server: ServerProcess, redis_url: str) -> set[str]:
    r = redis.Redis.from_url(redis_url)
    try:
        pattern = f"{server.settings.key_prefix}server:*"
        return {k.decode() for k in r.scan_iter(pattern)} - {
            k.decode() for k in r.scan_iter(f"{server.settings.key_prefix}server:replica*")
        }
    finally:
        r.close()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def agent(**fields: Any) -> dict[str, Any]:
    return {"assistant_id": "agent", "input": {"messages": "hi"}, **fields}


BAD = [
    ("POST", "/threads", {"metadata": {"n": 2**70}}, "metadata"),
    ("POST", "/threads", {"metadata": nested(300)}, "metadata"),
    ("POST", "/threads", {"thread_id": "a\x07b"}, "thread_id"),
    ("POST", "/threads/search", {"offset": 2**70}, "offset"),
    ("POST", "/threads/search", {"metadata": {"n": -(2**64)}}, "metadata"),
    ("POST", "/runs/wait", agent(input={"messages": "hi", "n": 2**64}), "input"),
    ("POST", "/runs/wait", agent(metadata=nested(300)), "metadata"),
    ("POST", "/runs/wait", agent(config={"recursion_limit": 2**70}), "recursion_limit"),
    ("POST", "/runs", agent(after_seconds=1e300), "after_seconds"),
    ("POST", "/runs", agent(context={"deep": nested(300)}), "context"),
    (
        "POST",
        "/threads/ctl%0Ahere/runs/wait",
        agent(if_not_exists="create"),
        "thread_id",
    ),
    ("GET", "/threads/ctl%07here", None, "thread_id"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD)
def test_unstorable_values_are_422_naming_the_field_and_leave_nothing(
    server: ServerProcess,
    http: httpx.Client,
    redis_url: str,
    method: str,
    path: str,
    body: Any,
    field: str,
) -> None:
    before = server_keys(server, redis_url)
    response = http.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    assert server_keys(server, redis_url) == before


def test_history_filter_keys_must_be_plain_names(http: httpx.Client) -> None:
    """Given a thread, then a history filter key with a space is a 422 (the SQLite
    checkpointer would refuse it with a 500); a plain key filters."""
    tid = http.post("/threads", json={}).json()["thread_id"]
    http.post(f"/threads/{tid}/runs/wait", json=agent())
    bad = http.post(f"/threads/{tid}/history", json={"metadata": {"a b": 1}})
    assert bad.status_code == 422 and "metadata" in bad.json()["detail"]
    good = http.post(f"/threads/{tid}/history", json={"metadata": {"source": "loop"}})
    assert good.status_code == 200 and good.json()


def test_a_thread_id_no_header_can_carry_runs_once(http: httpx.Client) -> None:
    """Given a thread id outside latin-1, when a run is created on it, then the answer is
    a 200 whose Location is percent-encoded, and the thread has exactly that one run."""
    tid = "caf\u00e9-\u20ac-\u6f22"
    created = http.post(f"/threads/{tid}/runs", json=agent(if_not_exists="create"))
    assert created.status_code == 200, created.text
    assert created.headers["content-location"].startswith("/threads/caf%C3%A9-%E2%82%AC-")
    run_id = created.json()["run_id"]
    joined = http.get(f"/threads/{tid}/runs/{run_id}/join")
    assert joined.json()["messages"][-1]["content"] == "echo: hi"
    assert [r["run_id"] for r in http.get(f"/threads/{tid}/runs").json()] == [run_id]
