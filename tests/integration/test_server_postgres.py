"""Two replicas of ``toolfleet serve`` behind one Redis and one Postgres checkpointer.

A run started on replica A is streamed, joined and cancelled through replica B, as a
load balancer would route a client's later requests. The Postgres server is the one at
``TOOLFLEET_TEST_DATABASE_URL`` (CI sets it); each test run uses a schema of its own and
drops it afterwards. Without that variable these tests fail: they never skip.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError

from tests.support.serving import (
    ServerProcess,
    database_url,
    prefork_fleet,
    run,
    start_server,
    wait_for_states,
)
from tool_workers.contract.settings import Settings

__all__ = ["database_url", "prefork_fleet"]  # fixtures, imported so pytest finds them here

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def replicas(
    database_url: str, prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    workdir = tmp_path_factory.mktemp("replicas")
    token = f"tft-token-{uuid.uuid4().hex}"
    shared = {"database_url": database_url, "api_tokens": (token,)}
    # One after the other: the first creates the checkpoint tables.
    a = start_server(prefork_fleet, workdir / "a", "replica-a", **shared)
    try:
        b = start_server(prefork_fleet, workdir / "b", "replica-b", **shared)
    except BaseException:
        a.stop()
        raise
    yield a, b
    b.stop()
    a.stop()


def client(server: ServerProcess) -> Any:
    return get_client(url=server.url, api_key=server.settings.api_tokens[0])


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    text = json.dumps({"calls": [list(c) for c in calls]})
    return {"messages": [{"role": "user", "content": text}]}


def test_run_started_on_one_replica_is_streamed_and_joined_on_another(
    replicas: tuple[ServerProcess, ServerProcess],
) -> None:
    """Given a run started on A, when a client streams and joins it through B, then B
    relays its tool-call events and values, and B reads the final state from Postgres."""
    a, b = replicas

    async def scenario() -> tuple[Any, ...]:
        async with client(a) as on_a, client(b) as on_b:
            thread = await on_a.threads.create()
            tid = thread["thread_id"]
            created = await on_a.runs.create(
                tid,
                "agent",
                input=ask(("sleep_for", {"seconds": 0.5}), ("add", {"a": 1, "b": 1})),
                stream_mode=["values", "custom"],
            )
            parts = [p async for p in on_b.runs.join_stream(tid, created["run_id"])]
            joined = await on_b.runs.join(tid, created["run_id"])
            run_on_b = await on_b.runs.get(tid, created["run_id"])
            state = await on_b.threads.get_state(tid)
            return created, parts, joined, run_on_b, state

    created, parts, joined, run_on_b, state = run(scenario())

    assert run_on_b["replica"] == created["replica"]  # A ran it
    assert run_on_b["status"] == "success"
    events = [p.data["toolfleet"]["event"] for p in parts if p.event == "custom"]
    assert events.count("dispatched") == 2 and events.count("finished") == 2
    values = [p.data for p in parts if p.event == "values"]
    assert values[-1] == joined == state["values"]
    assert joined["messages"][-1]["content"] == "done: 2 results: slept 0.5, 2"


def test_run_on_one_replica_is_cancelled_from_another(
    replicas: tuple[ServerProcess, ServerProcess], prefork_fleet: Settings
) -> None:
    """Given a run on A whose tool call takes 30 s, when B cancels it, then the run ends
    interrupted within seconds and the tool's Celery task is REVOKED."""
    a, b = replicas

    async def scenario() -> tuple[str, Any, float, Any]:
        async with client(a) as on_a, client(b) as on_b:
            thread = await on_a.threads.create()
            tid = thread["thread_id"]
            created = await on_a.runs.create(
                tid, "agent", input=ask(("sleep_for", {"seconds": 30})), stream_mode="custom"
            )
            task_id = ""
            async for part in on_b.runs.join_stream(tid, created["run_id"]):
                if part.event == "custom" and part.data["toolfleet"]["event"] == "started":
                    task_id = part.data["toolfleet"]["task_id"]
                    break
            with pytest.raises(ConflictError):  # the thread is busy on every replica
                await on_b.runs.create(
                    tid, "agent", input={"messages": "meanwhile"}, multitask_strategy="reject"
                )
            t0 = time.monotonic()
            cancelled = await on_b.runs.cancel(tid, created["run_id"], wait=True)
            took = time.monotonic() - t0
            after = await on_a.runs.wait(tid, "agent", input={"messages": "next"})
            return task_id, cancelled, took, after

    task_id, cancelled, took, after = run(scenario())

    assert cancelled["status"] == "interrupted" and took < 5
    assert after["messages"][-1]["content"] == "echo: next"
    assert wait_for_states(prefork_fleet, [task_id], "REVOKED") == {task_id: "REVOKED"}


def test_a_run_rolled_back_from_another_replica_leaves_no_checkpoint(
    replicas: tuple[ServerProcess, ServerProcess],
) -> None:
    """Given a thread with one finished run and a second run on A in a 30 s tool call,
    when B cancels the second with ``action="rollback"``, then the run's record and every
    checkpoint it wrote are gone from Postgres: the thread is as the first run left it."""
    a, b = replicas

    async def scenario() -> tuple[Any, ...]:
        async with client(a) as on_a, client(b) as on_b:
            tid = (await on_a.threads.create())["thread_id"]
            kept = await on_a.runs.wait(tid, "agent", input={"messages": "kept"})
            before = await on_a.threads.get_history(tid, limit=50)
            created = await on_a.runs.create(
                tid, "agent", input=ask(("sleep_for", {"seconds": 30})), stream_mode="custom"
            )
            async for part in on_b.runs.join_stream(tid, created["run_id"]):
                if part.event == "custom" and part.data["toolfleet"]["event"] == "started":
                    break
            await on_b.runs.cancel(tid, created["run_id"], wait=True, action="rollback")
            history = await on_a.threads.get_history(tid, limit=50)
            runs = await on_b.runs.list(tid)
            state = await on_b.threads.get_state(tid)
            thread = await on_a.threads.get(tid)
            return kept, before, history, runs, state, thread

    kept, before, history, runs, state, thread = run(scenario())

    assert [h["checkpoint_id"] for h in history] == [h["checkpoint_id"] for h in before]
    assert len(runs) == 1 and runs[0]["status"] == "success"
    assert state["values"] == kept and thread["status"] == "idle"


def test_a_copied_thread_has_the_same_checkpoints_in_postgres(
    replicas: tuple[ServerProcess, ServerProcess],
) -> None:
    """Given a thread whose run made tool calls (checkpoints with channel blobs and
    writes), when A copies it, then B reads the copy's history as the original's, and a
    run on the copy continues from the copied messages without touching the original."""
    a, b = replicas

    async def scenario() -> tuple[Any, ...]:
        async with client(a) as on_a, client(b) as on_b:
            thread = await on_a.threads.create(metadata={"owner": "pg"})
            tid = thread["thread_id"]
            await on_a.runs.wait(tid, "agent", input=ask(("add", {"a": 2, "b": 3})))
            copy = await on_a.threads.copy(tid)
            original = await on_b.threads.get_history(tid, limit=100)
            copied = await on_b.threads.get_history(copy["thread_id"], limit=100)
            await on_b.runs.wait(copy["thread_id"], "agent", input=ask(("add", {"a": 1, "b": 1})))
            after = await on_a.threads.get_state(tid)
            grown = await on_a.threads.get_state(copy["thread_id"])
            return copy, original, copied, after, grown

    copy, original, copied, after, grown = run(scenario())

    assert copy["metadata"]["owner"] == "pg"
    assert [s["checkpoint"]["checkpoint_id"] for s in copied] == [
        s["checkpoint"]["checkpoint_id"] for s in original
    ]
    assert [s["values"] for s in copied] == [s["values"] for s in original]
    assert len(original) > 2
    assert len(after["values"]["messages"]) == len(original[0]["values"]["messages"])
    assert len(grown["values"]["messages"]) > len(after["values"]["messages"])
