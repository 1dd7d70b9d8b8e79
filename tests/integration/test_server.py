"""``toolfleet serve`` driven by the real ``langgraph-sdk`` client: threads, runs, streams.

One server (a subprocess of the real CLI, SQLite checkpoints) over a prefork fleet of its
own; the model is tests/server_models.py's, which calls the fleet tools the user message
names. Every call to the server goes through ``langgraph_sdk.get_client`` (or
``RemoteGraph``), except the malformed bodies the SDK would never send.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import (
    AuthenticationError,
    ConflictError,
    NotFoundError,
    RateLimitError,
    UnprocessableEntityError,
)

from orchestrator.server.eventlog import parse_id
from tests.support.serving import ServerProcess, prefork_fleet, run, start_server, wait_for_states
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(180)

MAX_RUNS = 24


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("server"),
        "server",
        max_runs=MAX_RUNS,
        tenant_max_runs=MAX_RUNS,  # one token alone reaches the replica's limit here
        tenant_max_queued=MAX_RUNS,
    )
    yield process
    process.stop()


def client(server: ServerProcess, token: str | None = "valid") -> Any:
    api_key = server.settings.api_tokens[0] if token == "valid" else token
    return get_client(url=server.url, api_key=api_key)


def ask(*calls: tuple[str, dict[str, Any]], model_delay: float = 0) -> dict[str, Any]:
    """Run input whose user message makes the test model call ``calls`` at once."""
    text = json.dumps({"calls": [list(c) for c in calls], "model_delay": model_delay})
    return {"messages": [{"role": "user", "content": text}]}


def tool_events(parts: list[Any]) -> list[dict[str, Any]]:
    return [p.data["toolfleet"] for p in parts if p.event == "custom" and "toolfleet" in p.data]


def test_assistants_are_searched_and_got(server: ServerProcess) -> None:
    """Given the server, when a client lists assistants, then it finds the one agent,
    by graph id and by assistant id; an unknown one is a 404."""

    async def scenario() -> None:
        async with client(server) as c:
            found = await c.assistants.search(graph_id="agent")
            assert [a["graph_id"] for a in found] == ["agent"]
            assert (await c.assistants.get("agent"))["assistant_id"] == found[0]["assistant_id"]
            assert (await c.assistants.get(found[0]["assistant_id"]))["name"] == "agent"
            with pytest.raises(NotFoundError):
                await c.assistants.get("no-such-assistant")

    run(scenario())


def test_stream_shows_the_fan_out_live_and_the_final_messages(server: ServerProcess) -> None:
    """Given a thread, when a run fans out three calls and is streamed with values,
    updates, messages-tuple and custom, then each call reports dispatched, started on a
    worker and finished with its duration, and the final state holds every result."""

    async def scenario() -> tuple[list[Any], dict[str, Any]]:
        async with client(server) as c:
            thread = await c.threads.create(metadata={"purpose": "fan-out"})
            calls = [("sleep_for", {"seconds": 0.4, "label": f"s{i}"}) for i in range(2)]
            parts = [
                part
                async for part in c.runs.stream(
                    thread["thread_id"],
                    "agent",
                    input=ask(*calls, ("add", {"a": 2, "b": 3})),
                    stream_mode=["values", "updates", "messages-tuple", "custom"],
                )
            ]
            found = await c.threads.search(metadata={"purpose": "fan-out"}, limit=5)
            assert [t["thread_id"] for t in found] == [thread["thread_id"]]
            return parts, await c.threads.get(thread["thread_id"])

    parts, thread = run(scenario())

    assert parts[0].event == "metadata" and parts[0].data["run_id"]
    assert {"values", "updates", "messages", "custom"} <= {p.event for p in parts}
    assert all(p.id for p in parts[1:])  # resumable: every part has an event id
    by_call: dict[str, list[dict[str, Any]]] = {}
    for event in tool_events(parts):
        by_call.setdefault(event["tool_call_id"], []).append(event)
    assert len(by_call) == 3
    for seen in by_call.values():
        kinds = [e["event"] for e in seen]
        assert kinds.index("dispatched") < kinds.index("finished")
        assert kinds.index("started") < kinds.index("finished")
        assert next(e for e in seen if e["event"] == "started")["worker"].startswith("tf-server-")
        finished = next(e for e in seen if e["event"] == "finished")
        assert finished["status"] == "success" and finished["duration"] >= 0
    final = [p for p in parts if p.event == "values"][-1].data["messages"]
    assert final[-1]["content"] == "done: 3 results: s0 0.4, s1 0.4, 5"
    assert [m["type"] for m in final] == ["human", "ai", "tool", "tool", "tool", "ai"]
    assert thread["status"] == "idle" and thread["metadata"]["purpose"] == "fan-out"
    assert thread["metadata"]["graph_id"] == "agent"
    assert thread["values"]["messages"][-1]["content"] == final[-1]["content"]


def test_custom_stream_mode_alone_carries_the_tool_call_events(server: ServerProcess) -> None:
    """Given a client asking only for ``custom``, then it gets the tool-call events only."""

    async def scenario() -> list[Any]:
        async with client(server) as c:
            thread = await c.threads.create()
            return [
                p
                async for p in c.runs.stream(
                    thread["thread_id"],
                    "agent",
                    input=ask(("add", {"a": 1, "b": 1})),
                    stream_mode="custom",
                )
            ]

    parts = run(scenario())

    assert {p.event for p in parts} == {"metadata", "custom"}
    kinds = [e["event"] for e in tool_events(parts)]
    assert {"dispatched", "started", "finished"} <= set(kinds)
    assert kinds[-1] == "finished"


def test_wait_then_state_and_history(server: ServerProcess) -> None:
    """Given a waited-for run, then the answer, the thread state and its history agree."""

    async def scenario() -> tuple[Any, Any, Any, Any]:
        async with client(server) as c:
            thread = await c.threads.create()
            values = await c.runs.wait(
                thread["thread_id"], "agent", input=ask(("add", {"a": 4, "b": 5}))
            )
            state = await c.threads.get_state(thread["thread_id"])
            history = await c.threads.get_history(thread["thread_id"], limit=50)
            earlier = await c.threads.get_state(
                thread["thread_id"], checkpoint_id=history[-1]["checkpoint"]["checkpoint_id"]
            )
            return values, state, history, earlier

    values, state, history, earlier = run(scenario())

    assert values["messages"][-1]["content"] == "done: 1 results: 9"
    assert state["values"] == values and state["next"] == []
    assert state["checkpoint"]["checkpoint_id"] == history[0]["checkpoint"]["checkpoint_id"]
    assert len(history) >= 4  # input, model, tools, model
    assert (
        history[0]["parent_checkpoint"]["checkpoint_id"]
        == history[1]["checkpoint"]["checkpoint_id"]
    )
    assert earlier["values"].get("messages", []) == []


def test_background_run_is_got_listed_joined_and_replayed(server: ServerProcess) -> None:
    """Given a background run, then get/list show it, join returns the final values once
    it is done, and joining its stream afterwards replays it from the start."""

    async def scenario() -> tuple[Any, ...]:
        async with client(server) as c:
            thread = await c.threads.create()
            created = await c.runs.create(
                thread["thread_id"], "agent", input=ask(("sleep_for", {"seconds": 0.5}))
            )
            tid, rid = thread["thread_id"], created["run_id"]
            during = await c.runs.get(tid, rid)
            joined = await c.runs.join(tid, rid)
            after = await c.runs.get(tid, rid)
            listed = await c.runs.list(tid)
            replay = [p async for p in c.runs.join_stream(tid, rid, stream_mode="values")]
            resumed = [p async for p in c.runs.join_stream(tid, rid, last_event_id=replay[1].id)]
            return created, during, joined, after, listed, replay, resumed

    created, during, joined, after, listed, replay, resumed = run(scenario())

    assert created["status"] == "pending" and during["status"] in ("pending", "running")
    assert joined["messages"][-1]["content"] == "done: 1 results: slept 0.5"
    assert after["status"] == "success" and after["replica"]
    assert [r["run_id"] for r in listed] == [created["run_id"]]
    assert replay[0].event == "metadata"
    assert {p.event for p in replay[1:]} == {"values"}
    assert replay[-1].data == joined
    # Resuming after the first values part: only later parts come, without a second
    # metadata event (the client has it).
    assert resumed and all(parse_id(p.id) > parse_id(replay[1].id) for p in resumed)
    assert {p.event for p in resumed} == {"values"}


def test_cancel_stops_the_run_and_revokes_its_tool_tasks(
    server: ServerProcess, prefork_fleet: Settings
) -> None:
    """Given a run whose two tool calls each take 30 s, when it is cancelled once both
    started, then the run is interrupted at once and both Celery tasks are REVOKED."""

    async def scenario() -> tuple[list[str], Any, float]:
        async with client(server) as c:
            thread = await c.threads.create()
            slow = ("sleep_for", {"seconds": 30})
            created = await c.runs.create(
                thread["thread_id"], "agent", input=ask(slow, slow), stream_mode="custom"
            )
            started: list[str] = []
            async for part in c.runs.join_stream(thread["thread_id"], created["run_id"]):
                if part.event == "custom" and part.data["toolfleet"]["event"] == "started":
                    started.append(part.data["toolfleet"]["task_id"])
                    if len(started) == 2:
                        break
            t0 = time.monotonic()
            cancelled = await c.runs.cancel(thread["thread_id"], created["run_id"], wait=True)
            return started, cancelled, time.monotonic() - t0

    task_ids, cancelled, took = run(scenario())

    assert cancelled["status"] == "interrupted"
    assert took < 5
    states = wait_for_states(prefork_fleet, task_ids, "REVOKED")
    assert set(states.values()) == {"REVOKED"}, states


def test_cancel_stops_a_model_call(server: ServerProcess) -> None:
    """Given a run stuck in a 60 s model call, when cancelled, then it ends interrupted
    within seconds and the thread is free for the next run."""

    async def scenario() -> tuple[Any, Any]:
        async with client(server) as c:
            thread = await c.threads.create()
            created = await c.runs.create(thread["thread_id"], "agent", input=ask(model_delay=60))
            while (await c.runs.get(thread["thread_id"], created["run_id"]))["status"] != "running":
                await asyncio.sleep(0.05)
            cancelled = await c.runs.cancel(thread["thread_id"], created["run_id"], wait=True)
            nxt = await c.runs.wait(thread["thread_id"], "agent", input={"messages": "hello"})
            return cancelled, nxt

    cancelled, nxt = run(scenario())

    assert cancelled["status"] == "interrupted"
    assert nxt["messages"][-1]["content"] == "echo: hello"


def test_client_leaving_a_stream_does_not_cancel_the_run(server: ServerProcess) -> None:
    """Given a streamed run, when the client disconnects after the first part, then the
    run still completes."""

    async def scenario() -> Any:
        async with client(server) as c:
            thread = await c.threads.create()
            stream = c.runs.stream(
                thread["thread_id"], "agent", input=ask(("sleep_for", {"seconds": 0.5}))
            )
            first = await anext(stream)
            await stream.aclose()  # closes the response: the client is gone
        async with client(server) as c:
            return await c.runs.join(thread["thread_id"], first.data["run_id"])

    assert run(scenario())["messages"][-1]["content"] == "done: 1 results: slept 0.5"


def test_busy_thread_queues_by_default_and_conflicts_on_reject(server: ServerProcess) -> None:
    """Given a running run, then another run on its thread is queued after it by default
    (as LangGraph's server does), while ``multitask_strategy="reject"`` is a 409; an
    existing thread id is a 409 too."""

    async def scenario() -> tuple[Any, Any]:
        async with client(server) as c:
            thread = await c.threads.create()
            tid = thread["thread_id"]
            first = await c.runs.create(tid, "agent", input=ask(("sleep_for", {"seconds": 1})))
            with pytest.raises(ConflictError):
                await c.runs.create(
                    tid, "agent", input={"messages": "refused"}, multitask_strategy="reject"
                )
            queued = await c.runs.create(tid, "agent", input={"messages": "third"})
            final = await c.runs.join(tid, queued["run_id"])
            with pytest.raises(ConflictError):
                await c.threads.create(thread_id=tid)
            return await c.runs.get(tid, first["run_id"]), final

    first, final = run(scenario())

    assert first["status"] == "success"
    contents = [m["content"] for m in final["messages"]]
    assert contents[-1] == "echo: third" and "done: 1 results: slept 1.0" in contents
    assert "echo: refused" not in contents


def test_interrupt_strategy_cancels_the_running_run(server: ServerProcess) -> None:
    """Given a run in a 60 s model call, when another run on its thread asks to
    interrupt, then the first ends interrupted and the second runs."""

    async def scenario() -> tuple[Any, Any]:
        async with client(server) as c:
            tid = (await c.threads.create())["thread_id"]
            first = await c.runs.create(tid, "agent", input=ask(model_delay=60))
            second = await c.runs.create(
                tid, "agent", input={"messages": "now"}, multitask_strategy="interrupt"
            )
            final = await c.runs.join(tid, second["run_id"])
            return await c.runs.get(tid, first["run_id"]), final

    first, final = run(scenario())

    assert first["status"] == "interrupted"
    assert final["messages"][-1]["content"] == "echo: now"


def test_unknown_threads_and_runs_are_404(server: ServerProcess) -> None:
    async def scenario() -> None:
        async with client(server) as c:
            missing = str(uuid.uuid4())
            with pytest.raises(NotFoundError):
                await c.threads.get(missing)
            with pytest.raises(NotFoundError):
                await c.threads.get_state(missing)
            with pytest.raises(NotFoundError):
                await c.runs.create(missing, "agent", input={"messages": "hi"})
            thread = await c.threads.create()
            with pytest.raises(NotFoundError):
                await c.runs.get(thread["thread_id"], missing)
            with pytest.raises(NotFoundError):
                await c.runs.cancel(thread["thread_id"], missing)
            odd_id = f"user:{missing}:runs"  # a client's thread id may look like a key
            made = await c.runs.wait(
                odd_id, "agent", input={"messages": "made"}, if_not_exists="create"
            )
            assert [r["status"] for r in await c.runs.list(odd_id)] == ["success"]
            assert made["messages"][-1]["content"] == "echo: made"

    run(scenario())


def test_malformed_bodies_are_422_naming_the_field(server: ServerProcess) -> None:
    async def scenario() -> None:
        async with client(server) as c:
            thread = await c.threads.create()
            with pytest.raises(UnprocessableEntityError, match="stream_mode"):
                await c.runs.create(thread["thread_id"], "agent", stream_mode="sideways")
            with pytest.raises(UnprocessableEntityError, match="multitask_strategy"):
                await c.runs.create(thread["thread_id"], "agent", multitask_strategy="later")

    run(scenario())
    headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    response = httpx.post(f"{server.url}/runs/wait", json={"input": {}}, headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"] == "assistant_id: Field required"


def test_tokens_are_required_and_never_logged(server: ServerProcess) -> None:
    """Given the server, then a request without a token or with a wrong one is a 401, a
    bearer token works as well as X-Api-Key, and no token reaches the server's log."""
    wrong = f"wrong-{uuid.uuid4().hex}"

    async def scenario() -> None:
        for token in (None, wrong):
            async with client(server, token) as c:
                with pytest.raises(AuthenticationError):
                    await c.threads.create()
        headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
        async with get_client(url=server.url, api_key=None, headers=headers) as c:
            await c.threads.create()

    run(scenario())
    assert httpx.get(f"{server.url}/ok").status_code == 200
    assert httpx.get(f"{server.url}/docs").status_code == 200
    assert "/threads/{thread_id}/runs/stream" in httpx.get(f"{server.url}/openapi.json").text
    log = server.log()
    assert "401" in log
    assert server.settings.api_tokens[0] not in log and wrong not in log


def test_readiness_reports_redis_and_workers(server: ServerProcess) -> None:
    ready = httpx.get(f"{server.url}/ready").json()
    assert ready["ready"] is True and ready["redis"] is True and ready["workers"] >= 1


def test_many_runs_at_once_and_429_beyond_the_limit(server: ServerProcess) -> None:
    """Given runs stalled 4 s in their model call, when the replica's limit of runs is
    started, then they run concurrently (far below the serial time) and one more is 429."""

    async def scenario() -> tuple[float, list[Any]]:
        async with client(server) as c:
            threads = [await c.threads.create() for _ in range(MAX_RUNS)]
            t0 = time.monotonic()
            runs = [
                await c.runs.create(t["thread_id"], "agent", input=ask(model_delay=4))
                for t in threads
            ]
            extra = await c.threads.create()
            with pytest.raises(RateLimitError):
                await c.runs.create(extra["thread_id"], "agent", input={"messages": "one more"})
            results = await asyncio.gather(
                *(
                    c.runs.join(t["thread_id"], r["run_id"])
                    for t, r in zip(threads, runs, strict=True)
                )
            )
            return time.monotonic() - t0, results

    elapsed, results = run(scenario())

    assert all(r["messages"][-1]["content"].startswith("echo: ") for r in results)
    assert elapsed < 4 * 3  # serial: 96 s


def test_stateless_run_and_remote_graph(server: ServerProcess) -> None:
    """Given no thread, then runs.wait answers; RemoteGraph drives the server as a graph."""
    from langgraph.pregel.remote import RemoteGraph

    async def stateless() -> Any:
        async with client(server) as c:
            return await c.runs.wait(None, "agent", input=ask(("add", {"a": 1, "b": 2})))

    assert run(stateless())["messages"][-1]["content"] == "done: 1 results: 3"

    with get_sync_client(url=server.url, api_key=server.settings.api_tokens[0]) as sync:
        remote = RemoteGraph("agent", sync_client=sync)
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        state = remote.invoke(ask(("add", {"a": 20, "b": 22})), config)
        snapshot = remote.get_state(config)
    assert state["messages"][-1]["content"] == "done: 1 results: 42"
    assert snapshot.values["messages"][-1]["content"] == "done: 1 results: 42"
