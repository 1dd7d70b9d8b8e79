"""Query and body fields that were accepted and ignored, against both servers: ``/ok``
with ``check_db``, ``/metrics`` in both formats, ``GET /threads/{id}?include=ttl``, and
``feedback_keys`` on a run. What LangGraph's server acts on, toolfleet acts on alike;
what it cannot do, it refuses with a 422 naming the field."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.support.api_pair import ApiPair, api_pair
from tests.support.serving import prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-meta-{uuid.uuid4().hex}",))


def _get(url: str, path: str) -> httpx.Response:
    return httpx.get(f"{url}{path}", timeout=10)


def test_ok_checks_the_data_stores_when_asked(pair: ApiPair) -> None:
    """Given both servers up, when ``/ok`` is asked with and without ``check_db``, then
    both answer 200 ``ok``, toolfleet's data stores (Redis, the checkpointer) skipped
    without it and healthy with it; a ``check_db`` other than 0 or 1 is refused."""
    answers = []
    for server in (pair.toolfleet, pair.langgraph):
        plain, checked = _get(server.url, "/ok"), _get(server.url, "/ok?check_db=1")
        answers.append(
            [
                plain.status_code,
                plain.json()["ok"],
                set(plain.json()["services"].values()),
                checked.status_code,
                checked.json()["ok"],
                set(checked.json()["services"].values()),
            ]
        )
    ours, theirs = answers

    # (langgraph dev keeps everything in memory: it has no data store to check)
    assert theirs == [200, True, set(), 200, True, set()]
    assert ours == [200, True, {"skipped"}, 200, True, {"healthy"}]
    assert set(_get(pair.toolfleet.url, "/ok?check_db=1").json()["services"]) == {
        "redis",
        "database",
    }
    refused = _get(pair.toolfleet.url, "/ok?check_db=yes")
    assert refused.status_code == 422
    assert "check_db" in refused.json()["detail"]


def test_metrics_in_both_formats(pair: ApiPair) -> None:
    """Given both servers, when ``/metrics`` is asked for Prometheus text and for JSON,
    then both answer the exposition text by default and with ``format=prometheus``, and
    with ``format=json`` a JSON object with the run queue and the workers as LangGraph's
    server counts them (toolfleet's runs and its cap of them)."""
    answers = []
    for server in (pair.toolfleet, pair.langgraph):
        default = _get(server.url, "/metrics")
        prometheus = _get(server.url, "/metrics?format=prometheus")
        as_json = _get(server.url, "/metrics?format=json")
        body = as_json.json()
        answers.append(
            [
                default.headers["content-type"].split(";")[0],
                prometheus.headers["content-type"].split(";")[0],
                as_json.status_code,
                as_json.headers["content-type"],
                {"n_pending", "n_running"} <= set(body["queue"]),
                set(body["workers"]),
            ]
        )
    ours, theirs = answers

    assert ours == theirs
    assert ours[0] == "text/plain"
    assert ours[5] == {"max", "active", "available"}
    ours_json = _get(pair.toolfleet.url, "/metrics?format=json").json()
    assert ours_json["workers"]["max"] == pair.toolfleet.settings.max_runs
    assert "toolfleet_server_runs_max" in _get(pair.toolfleet.url, "/metrics").text
    refused = _get(pair.toolfleet.url, "/metrics?format=xml")
    assert refused.status_code == 422
    assert "format" in refused.json()["detail"]


def test_get_thread_includes_its_ttl(pair: ApiPair) -> None:
    """Given a thread, when it is read with ``include=ttl``, then toolfleet answers its
    expiry (threads are deleted TOOLFLEET_THREAD_TTL after their last change) and without
    it no ``ttl``, as LangGraph's server with a database does; an ``include`` of a field
    it cannot add is refused naming ``include``."""

    async def scenario() -> list[Any]:
        async with pair.client(pair.toolfleet) as c:
            tid = (await c.threads.create())["thread_id"]
            plain = await c.threads.get(tid)
            asked = await c.http.client.get(f"/threads/{tid}", params={"include": "ttl"})
            with_ttl = asked.json()
            refused = await c.http.client.get(f"/threads/{tid}", params={"include": "ttl,nope"})
            return [plain, with_ttl, refused.status_code, refused.json()["detail"]]

    plain, with_ttl, status, detail = run(scenario())

    assert "ttl" not in plain
    ttl = with_ttl["ttl"]
    minutes = pair.toolfleet.settings.thread_ttl / 60
    assert ttl["strategy"] == "delete"
    assert ttl["ttl_minutes"] == minutes
    expires = datetime.fromisoformat(ttl["expires_at"])
    updated = datetime.fromisoformat(with_ttl["updated_at"])
    assert abs(expires - updated - timedelta(minutes=minutes)) < timedelta(seconds=30)
    assert status == 422 and "include" in detail


def test_feedback_keys_are_refused(pair: ApiPair) -> None:
    """Given a run asking for LangSmith feedback URLs (``feedback_keys``), then toolfleet,
    which has no LangSmith, refuses it with a 422 naming the field and starts nothing;
    an empty list asks for nothing and is accepted."""

    async def scenario() -> list[Any]:
        async with pair.client(pair.toolfleet) as c:
            tid = (await c.threads.create())["thread_id"]
            body = {"assistant_id": "made", "input": {}, "feedback_keys": ["correctness"]}
            refused = await c.http.client.post(f"/threads/{tid}/runs/wait", json=body)
            runs_after = await c.runs.list(tid)
            empty = await c.http.client.post(
                f"/threads/{tid}/runs/wait", json={**body, "feedback_keys": []}
            )
            return [refused.status_code, refused.json()["detail"], runs_after, empty.status_code]

    status, detail, runs_after, empty = run(scenario())

    assert status == 422 and detail.startswith("feedback_keys")
    assert runs_after == []
    assert empty == 200
