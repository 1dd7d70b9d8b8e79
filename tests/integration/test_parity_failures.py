"""A failed run and a rejoined stream, against LangGraph's server: the same langgraph-sdk
calls to ``toolfleet serve`` and ``langgraph dev`` on one project."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.api_pair import ApiPair, api_pair
from tests.support.serving import prefork_fleet
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}",))


def test_a_failed_run_leaves_its_thread_and_the_search_readable(pair: ApiPair) -> None:
    """Given a thread with one good run, when a run with a message of an unknown role
    fails on it, then on both servers the run is ``error``, the thread reads as ``error``
    and the tenant's search finds it; toolfleet's state of the thread is its last good
    checkpoint."""

    async def scenario(c: Any) -> dict[str, Any]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        good = {"messages": [{"role": "user", "content": "hello"}]}
        await c.runs.wait(tid, "fleet", input=good)
        bad = {"messages": [{"role": "bogus-role", "content": "x"}]}
        try:  # the SDK raises the run's error, as it does for LangGraph's server
            await c.runs.wait(tid, "fleet", input=bad)
            failed = "no error"
        except Exception as exc:
            failed = type(exc).__name__
        runs = await c.runs.list(tid)
        read = await c.threads.get(tid)
        try:
            state = await c.threads.get_state(tid)
        except Exception as exc:
            state = {"values": {"messages": []}, "error": f"{type(exc).__name__}: {exc}"}
        found = await c.threads.search()
        return {
            "failed": failed,
            "run_status": runs[0]["status"],
            "thread_status": read["status"],
            "messages": [m["type"] for m in state["values"]["messages"]],
            "state_error": state.get("error"),
            "found": any(t["thread_id"] == tid for t in found),
        }

    ours, theirs = pair.both(scenario)

    for result in (ours, theirs):
        assert result["failed"] != "no error", result  # the SDK raises the run's error
        assert result["run_status"] == "error", result
        assert result["thread_status"] == "error", result
        assert result["found"] is True, result
    # The state is the last good checkpoint here; LangGraph's server answers its state
    # with a 400 (it applies the failed input again), so only toolfleet's is compared.
    assert ours["state_error"] is None and ours["messages"] == ["human", "ai"], ours
    assert "bogus-role" in str(theirs["state_error"]), theirs


def test_last_event_id_minus_one_replays_a_run_from_its_start(pair: ApiPair) -> None:
    """Given a finished run, when its stream is joined with ``Last-Event-ID: -1`` (what
    useStream sends to rejoin from the start), then every event is replayed; another
    malformed id is a 422."""
    server = pair.toolfleet
    headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        thread = http.post("/threads", json={}).json()
        run = http.post(
            f"/threads/{thread['thread_id']}/runs/wait",
            json={
                "assistant_id": "fleet",
                "input": {"messages": [{"role": "user", "content": "hi"}]},
            },
        )
        assert run.status_code == 200, run.text
        runs = http.get(f"/threads/{thread['thread_id']}/runs").json()
        path = f"/threads/{thread['thread_id']}/runs/{runs[0]['run_id']}/stream"
        replay = http.get(path, headers={"Last-Event-ID": "-1"})
        bad = http.get(path, headers={"Last-Event-ID": "not-an-id"})

    assert replay.status_code == 200, replay.text
    assert replay.text.startswith("event: metadata") and "event: values" in replay.text
    assert bad.status_code == 422
