"""``toolfleet serve`` with several tenants: each sees its own threads and runs only.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own, with the
tokens ``team-a:<A1>,team-a:<A2>,<B>``: two tokens of the named tenant ``team-a`` and one
bare token, a tenant of its own. Every call goes through ``langgraph_sdk.get_client``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError, RateLimitError

from tests.support.serving import TEST_MODEL, ServerProcess, prefork_fleet, run, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(180)

A1, A2, B = (f"tft-{name}-{uuid.uuid4().hex}" for name in ("a1", "a2", "b"))


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("tenancy"),
        "tenancy",
        api_tokens=(f"team-a:{A1}", f"team-a:{A2}", B),
        max_runs=8,
        tenant_max_runs=2,
        tenant_max_queued=2,
    )
    yield process
    process.stop()


def client(server: ServerProcess, token: str) -> Any:
    return get_client(url=server.url, api_key=token)


def ask(*calls: tuple[str, dict[str, Any]], model_delay: float = 0) -> dict[str, Any]:
    text = json.dumps({"calls": [list(c) for c in calls], "model_delay": model_delay})
    return {"messages": [{"role": "user", "content": text}]}


async def is_404(call: Any) -> None:
    """Await ``call``; it must fail with 404 (the SDK raises NotFoundError for most
    methods, httpx's error for some)."""
    try:
        await call
    except NotFoundError:
        return
    except httpx.HTTPStatusError as exc:
        assert exc.response.status_code == 404
        return
    raise AssertionError("no 404")


def test_another_tenant_gets_404_for_everything_of_a_thread(server: ServerProcess) -> None:
    """Given a thread and a finished run of team-a, then team-a's other token sees them,
    while tenant B gets 404 for the thread, its state, history, runs, a run, its join,
    stream, cancel and delete, and never finds the thread in a search."""

    async def scenario() -> None:
        async with client(server, A1) as a1, client(server, A2) as a2, client(server, B) as b:
            marker = uuid.uuid4().hex
            thread = await a1.threads.create(metadata={"marker": marker})
            tid = thread["thread_id"]
            await a1.runs.wait(tid, "agent", input=ask(("add", {"a": 1, "b": 2})))
            rid = (await a1.runs.list(tid))[0]["run_id"]

            assert (await a2.threads.get(tid))["metadata"]["marker"] == marker
            assert [
                t["thread_id"] for t in await a2.threads.search(metadata={"marker": marker})
            ] == [tid]
            assert (await a2.runs.get(tid, rid))["status"] == "success"

            for attempt in (
                lambda: b.threads.get(tid),
                lambda: b.threads.get_state(tid),
                lambda: b.threads.get_history(tid),
                lambda: b.runs.list(tid),
                lambda: b.runs.get(tid, rid),
                lambda: b.runs.join(tid, rid),
                lambda: b.runs.cancel(tid, rid),
                lambda: b.runs.delete(tid, rid),
                lambda: b.runs.create(tid, "agent", input={"messages": "mine now"}),
                lambda: b.threads.delete(tid),
            ):
                await is_404(attempt())
            with pytest.raises(NotFoundError):
                async for _ in b.runs.join_stream(tid, rid):
                    pass
            assert await b.threads.search(metadata={"marker": marker}) == []
            assert tid not in {t["thread_id"] for t in await b.threads.search(limit=1000)}

            # B may have a thread of the same id: a thread of its own, empty.
            mine = await b.threads.create(thread_id=tid)
            assert mine["values"] is None and mine["metadata"] == {}
            echoed = await b.runs.wait(tid, "agent", input={"messages": "b here"})
            assert [m["content"] for m in echoed["messages"]] == ["b here", "echo: b here"]
            kept = await a1.threads.get_state(tid)
            assert kept["values"]["messages"][-1]["content"] == "done: 1 results: 3"
            assert kept["checkpoint"]["thread_id"] == tid

    run(scenario())


def test_tenant_ids_never_reveal_tokens(server: ServerProcess, redis_url: str) -> None:
    """Given threads of both tenants, then no Redis key of the service holds a token,
    the bare token's tenant is a hash, and the server's log holds no token."""

    async def scenario() -> None:
        async with client(server, B) as b, client(server, A1) as a1:
            await b.threads.create()
            await a1.threads.create()

    run(scenario())
    r = redis.Redis.from_url(redis_url)
    try:
        names = [k.decode() for k in r.scan_iter(f"{server.settings.key_prefix}server:*")]
    finally:
        r.close()
    tenants = {n.rsplit(":", 1)[1] for n in names if ":server:threads:" in n}
    assert "team-a" in tenants and any(t.startswith("tk-") for t in tenants)
    for token in (A1, A2, B):
        assert not any(token in n for n in names)
        assert token not in server.log()


def test_one_tenant_cannot_take_another_tenants_first_run(server: ServerProcess) -> None:
    """Given team-a holding its share (2 running, 2 waiting) of a replica of 8, then
    team-a's next run is 429 while B's first run starts and finishes at once; team-a's
    waiting runs run after its first ones."""

    async def scenario() -> tuple[list[str], Any, list[Any]]:
        async with client(server, A1) as a, client(server, B) as b:
            threads = [(await a.threads.create())["thread_id"] for _ in range(4)]
            runs = [await a.runs.create(tid, "agent", input=ask(model_delay=3)) for tid in threads]
            extra = (await a.threads.create())["thread_id"]
            with pytest.raises(RateLimitError):
                await a.runs.create(extra, "agent", input={"messages": "one more"})
            await asyncio.sleep(0.5)
            statuses = [
                (await a.runs.get(t, r["run_id"]))["status"]
                for t, r in zip(threads, runs, strict=True)
            ]
            first_b = await asyncio.wait_for(
                b.runs.wait(None, "agent", input={"messages": "first"}), 3
            )
            joined = [await a.runs.join(t, r["run_id"]) for t, r in zip(threads, runs, strict=True)]
            return statuses, first_b, joined

    statuses, first_b, joined = run(scenario())

    assert sorted(statuses) == ["pending", "pending", "running", "running"]
    assert first_b["messages"][-1]["content"] == "echo: first"
    assert all(j["messages"][-1]["content"].startswith("echo: ") for j in joined)


def test_without_auth_every_request_is_one_anonymous_tenant(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Given ``serve --no-auth``, then requests need no token and all share one tenant."""
    workdir = tmp_path_factory.mktemp("no-auth")
    settings = prefork_fleet.model_copy(
        update={"api_tokens": (), "model": TEST_MODEL, "checkpoint_path": workdir / "c.sqlite"}
    )
    process = ServerProcess(settings, workdir, workdir / "server.log", args=("--no-auth",))
    process.start()
    try:
        created = httpx.post(f"{process.url}/threads", json={"metadata": {"who": "anyone"}})
        assert created.status_code == 200
        tid = created.json()["thread_id"]
        waited = httpx.post(
            f"{process.url}/threads/{tid}/runs/wait",
            json={"assistant_id": "agent", "input": {"messages": "hi"}},
            timeout=30,
        )
        assert waited.json()["messages"][-1]["content"] == "echo: hi"
        found = httpx.post(f"{process.url}/threads/search", json={"metadata": {"who": "anyone"}})
        assert [t["thread_id"] for t in found.json()] == [tid]
        assert "NO AUTH" in process.log()
    finally:
        process.stop()


def test_no_stream_mode_shows_the_internal_thread_key_or_tenant(server: ServerProcess) -> None:
    """Given a run of the bare token's tenant (a ``tk-`` hash) with a tool call, streamed
    in every mode (the graph's, and then ``events``, ``debug`` and ``checkpoints``
    again through the callback events), then no byte of either stream, of their replay
    (joining the finished run's stream) or of the thread's state and history holds the
    internal thread key (``tk-<hash>/<thread id>``), the tenant id or the config key
    that carries it (``__toolfleet_tenant``)."""
    headers = {"Authorization": f"Bearer {B}"}
    mode_sets = [
        ["values", "updates", "messages-tuple", "custom", "debug", "checkpoints", "tasks"],
        ["messages", "debug", "checkpoints", "tasks"],
        ["events", "debug", "checkpoints", "tasks", "values"],
    ]
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        tid = http.post("/threads", json={}).json()["thread_id"]
        seen: list[bytes] = []
        for modes in mode_sets:
            body = {
                "assistant_id": "agent",
                "input": ask(("add", {"a": 1, "b": 2})),
                "stream_mode": modes,
                "stream_subgraphs": True,
            }
            with http.stream("POST", f"/threads/{tid}/runs/stream", json=body) as streamed:
                assert streamed.status_code == 200
                seen.append(streamed.read())
            rid = http.get(f"/threads/{tid}/runs", params={"limit": 1}).json()[0]["run_id"]
            with http.stream("GET", f"/threads/{tid}/runs/{rid}/stream") as joined:
                seen.append(joined.read())
        seen.append(http.get(f"/threads/{tid}/state").content)
        seen.append(http.post(f"/threads/{tid}/history", json={"limit": 50}).content)
    for mode in ("debug", "checkpoints", "tasks", "events", "messages", "updates", "values"):
        assert any(f"event: {mode}".encode() in chunk for chunk in seen), mode
    for chunk in seen:
        assert b"tk-" not in chunk, chunk[max(0, chunk.find(b"tk-") - 300) :][:600]
        assert b"__toolfleet_tenant" not in chunk
