"""Request fields LangGraph's server acts on, against it: a thread created with its
history (``supersteps``), a cancel that rolls runs back, an assistant deleted with its
threads, searches that select, extract and filter by values, and the statuses of a
cancel that finds nothing to cancel. The same ``langgraph-sdk`` calls to ``toolfleet
serve`` and ``langgraph dev``, their answers compared."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.api_pair import ApiPair, api_pair, shape, status_of
from tests.support.serving import prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

SLOW = {
    "messages": [
        {"role": "user", "content": json.dumps({"calls": [["sleep_for", {"seconds": 20}]]})}
    ]
}
"""Input on which the fleet graph's one tool call sleeps on a worker for 20 s."""

HISTORY = [
    {"updates": [{"values": {"seen": "first", "runs": 1}, "as_node": "note"}]},
    {"updates": [{"values": {"runs": 2}, "as_node": "note"}]},
]
"""Two supersteps of the made graph's node: ``runs`` adds up (1 + 2)."""


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}",))


async def _running(c: Any) -> tuple[str, str]:
    """A thread and its run of the fleet graph, in its tool call."""
    thread = await c.threads.create()
    started = await c.runs.create(thread["thread_id"], "fleet", input=SLOW)
    tid, rid = thread["thread_id"], started["run_id"]
    while (await c.runs.get(tid, rid))["status"] == "pending":
        await asyncio.sleep(0.1)
    return tid, rid


def test_supersteps_make_the_threads_history(pair: ApiPair) -> None:
    """When a thread is created with two supersteps of the made graph's node, then its
    state is their updates reduced, its history has a checkpoint per superstep (and the
    empty one before), and a run after them adds to that state, on both servers."""

    async def scenario(c: Any) -> list[Any]:
        thread = await c.threads.create(metadata={"graph_id": "made"}, supersteps=HISTORY)
        tid = thread["thread_id"]
        state = await c.threads.get_state(tid)
        history = await c.threads.get_history(tid, limit=10)
        got = await c.threads.get(tid)
        after = await c.runs.wait(tid, "made", input={})
        return [
            state["values"],
            state["next"],
            [h["metadata"]["source"] for h in history],
            [h["metadata"]["step"] for h in history],
            got["status"],
            after["runs"],
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours[0] == {"seen": "first", "runs": 3}
    assert ours[-1] == 4


# Alone: under the other tests' load, LangGraph's server kept the rolled-back run's
# checkpoints (2 of 2 parallel runs, 0 of 10 alone).
@pytest.mark.serial
def test_cancel_many_rollback_deletes_the_run(pair: ApiPair) -> None:
    """Given a run in its tool call, when runs.cancel_many rolls it back, then the run is
    gone (404) with the checkpoints it wrote: the thread has no state, as before it."""

    async def scenario(c: Any) -> list[Any]:
        tid, rid = await _running(c)
        await c.runs.cancel_many(thread_id=tid, run_ids=[rid], action="rollback")
        while await status_of(c.runs.get(tid, rid)) == 200:
            await asyncio.sleep(0.1)
        state = await c.threads.get_state(tid)
        return [await c.runs.list(tid), state["values"], state["checkpoint"] is None]

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours[0] == []


def test_cancelling_a_finished_run_is_404(pair: ApiPair) -> None:
    """Given a run that finished, when it is cancelled (one run, or many by ids), then
    both servers answer 404: there is nothing to cancel."""

    async def scenario(c: Any) -> list[int]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        finished = await c.runs.create(tid, "made", input={})
        await c.runs.join(tid, finished["run_id"])
        rid = finished["run_id"]
        return [
            await status_of(c.runs.cancel(tid, rid)),
            await status_of(c.runs.cancel(tid, rid, action="rollback")),
            await status_of(c.runs.cancel_many(thread_id=tid, run_ids=[rid])),
            (await c.runs.get(tid, rid))["status"] == "success",
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [404, 404, 404, True]


def test_delete_assistant_with_its_threads(pair: ApiPair) -> None:
    """Given an assistant with a thread it ran on, when it is deleted with
    ``delete_threads``, then the thread is gone; another assistant's thread stays."""

    async def scenario(c: Any) -> list[int]:
        doomed = await c.assistants.create("made", name="doomed")
        kept = await c.assistants.create("made", name="kept")
        ran = (await c.threads.create())["thread_id"]
        await c.runs.wait(ran, doomed["assistant_id"], input={})
        other = (await c.threads.create())["thread_id"]
        await c.runs.wait(other, kept["assistant_id"], input={})
        await c.assistants.delete(doomed["assistant_id"], delete_threads=True)
        result = [
            await status_of(c.threads.get(ran)),
            await status_of(c.threads.get(other)),
            await status_of(c.assistants.get(doomed["assistant_id"])),
        ]
        await c.assistants.delete(kept["assistant_id"])
        return [*result, await status_of(c.threads.get(other))]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [404, 200, 404, 200]


def test_search_selects_extracts_and_filters_by_values(pair: ApiPair) -> None:
    """Given two threads with different state, when threads are searched by values,
    with ``select`` and ``extract``, counted by values, and assistants and runs are
    listed with ``select``, then both servers answer the same fields and values; an
    unknown column or extract path is a 422 on both."""
    tag = uuid.uuid4().hex

    async def scenario(c: Any) -> list[Any]:
        one = await c.threads.create(
            metadata={"graph_id": "made", "tag": tag}, supersteps=HISTORY[:1]
        )
        await c.threads.create(metadata={"graph_id": "made", "tag": tag}, supersteps=HISTORY)
        found = await c.threads.search(
            metadata={"tag": tag},
            values={"runs": 1},
            select=["thread_id", "values", "status"],
            extract={"seen": "values.seen", "missing": "values.nothing.here"},
        )
        tid = one["thread_id"]
        counts = [
            await c.threads.count(metadata={"tag": tag}, values={"runs": 3}),
            await c.threads.count(metadata={"tag": tag}, values={"seen": "first"}),
        ]
        run = await c.runs.wait(tid, "made", input={})
        runs = await c.runs.list(tid, select=["run_id", "status"])
        assistants = await c.assistants.search(graph_id="made", select=["graph_id", "name"])
        return [
            found,
            found[0]["thread_id"] == tid,
            *counts,
            run["runs"],
            runs,
            assistants,
            await status_of(c.threads.search(select=["thread_id", "nonsense"])),
            await status_of(c.threads.search(extract={"x": "status.nested"})),
            await status_of(c.runs.list(tid, select=["nonsense"])),
            await status_of(c.assistants.search(select=["nonsense"])),
        ]

    ours, theirs = pair.both(scenario)

    assert shape(ours) == shape(theirs)
    assert ours[0] == [
        {
            "thread_id": ours[0][0]["thread_id"],
            "values": {"seen": "first", "runs": 1},
            "status": "idle",
            "extracted": {"seen": "first", "missing": None},
        }
    ]
    assert ours[1:5] == theirs[1:5] == [True, 1, 2, 2]
    assert [set(r) for r in ours[5]] == [set(r) for r in theirs[5]] == [{"run_id", "status"}]
    assert ours[6] == theirs[6] == [{"graph_id": "made", "name": "made"}]
    assert ours[7:] == theirs[7:] == [422, 422, 422, 422]


def test_extract_reads_list_indexes_of_messages(pair: ApiPair) -> None:
    """Given a thread the fleet agent answered, when threads are searched with extract
    paths through the messages list (``[-1]``, ``[0]``, out of range), then both servers
    pick the same values: the last message's text, the first one's type, and null."""
    tag = uuid.uuid4().hex

    async def scenario(c: Any) -> list[Any]:
        thread = await c.threads.create(metadata={"tag": tag})
        hello = {"messages": [{"role": "user", "content": "hello"}]}
        await c.runs.wait(thread["thread_id"], "fleet", input=hello)
        found = await c.threads.search(
            metadata={"tag": tag},
            select=["thread_id"],
            extract={
                "last": "values.messages[-1].content",
                "first_type": "values.messages[0].type",
                "beyond": "values.messages[9].content",
            },
        )
        return [t["extracted"] for t in found]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [{"last": "echo: hello", "first_type": "human", "beyond": None}]


def test_a_kept_stateless_run_leaves_its_metadata_on_the_thread(pair: ApiPair) -> None:
    """Given a run without a thread, with metadata and ``on_completion="keep"``, then the
    thread kept for it carries the run's metadata beside its graph and assistant, on
    both servers (and a thread made by ``if_not_exists="create"`` likewise)."""
    tag = uuid.uuid4().hex

    async def scenario(c: Any) -> list[Any]:
        await c.runs.wait(
            None, "made", input={}, metadata={"tag": tag, "n": 1}, on_completion="keep"
        )
        kept = await c.threads.search(metadata={"tag": tag})
        made = await c.runs.wait(
            str(uuid.uuid4()),
            "made",
            input={},
            metadata={"tag": tag, "n": 2},
            if_not_exists="create",
        )
        created = await c.threads.search(metadata={"tag": tag, "n": 2})
        return [
            [t["metadata"] for t in kept],
            [t["metadata"] for t in created],
            made["runs"],
        ]

    ours, theirs = pair.both(scenario)

    wanted = {"tag": tag, "graph_id": "made"}
    for result in (ours, theirs):
        assert [{k: m[k] for k in (*wanted, "n")} for m in result[0]] == [{**wanted, "n": 1}]
        assert [{k: m[k] for k in (*wanted, "n")} for m in result[1]] == [{**wanted, "n": 2}]
    assert shape(ours[:2]) == shape(theirs[:2])


def test_refusals_name_the_field(pair: ApiPair) -> None:
    """Given what toolfleet cannot do as asked, then it refuses and writes nothing:
    supersteps without a graph (400), supersteps the graph refuses (422 naming
    ``supersteps``), a thread TTL on create or update (422 naming ``ttl``)."""

    async def scenario() -> list[Any]:
        async with pair.client(pair.toolfleet) as c:
            answers = []
            for body in (
                {"supersteps": HISTORY},
                {
                    "metadata": {"graph_id": "made"},
                    "supersteps": [{"updates": [{"values": {"runs": 1}, "as_node": "nowhere"}]}],
                },
                {"ttl": {"ttl": 5, "strategy": "delete"}},
            ):
                tid = str(uuid.uuid4())
                response = await c.http.client.post("/threads", json={**body, "thread_id": tid})
                answers.append((response.status_code, response.json()["detail"]))
                answers.append(await status_of(c.threads.get(tid)))
            kept = (await c.threads.create())["thread_id"]
            response = await c.http.client.patch(f"/threads/{kept}", json={"ttl": {"ttl": 5}})
            answers.append((response.status_code, response.json()["detail"]))
            return answers

    answers = run(scenario())

    statuses = [a if isinstance(a, int) else a[0] for a in answers]
    assert statuses == [400, 404, 422, 404, 422, 404, 422]
    assert "graph_id" in answers[0][1]
    assert answers[2][1].startswith("supersteps")
    assert answers[4][1].startswith("ttl") and answers[6][1].startswith("ttl")


def test_checkpoint_during_false_saves_only_the_end(pair: ApiPair) -> None:
    """Given runs of the made graph with ``checkpoint_during`` false and true (the older
    form of ``durability``), then the first saves only its last checkpoint and the
    second every step's, on both servers."""

    async def scenario(c: Any) -> list[int]:
        counts = []
        for during in (False, True):
            tid = (await c.threads.create())["thread_id"]
            body = {"assistant_id": "made", "input": {}, "checkpoint_during": during}
            await c.http.post(f"/threads/{tid}/runs/wait", json=body)  # the SDK warns
            counts.append(len(await c.threads.get_history(tid)))
        return counts

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours[0] < ours[1]


def test_join_cancels_on_disconnect(pair: ApiPair) -> None:
    """Given a run in its tool call, when a client joins it with
    ``cancel_on_disconnect`` and leaves before the end, then the run is cancelled
    (``interrupted``) on both servers; without it, leaving a join leaves the run going."""

    async def scenario(c: Any) -> list[str]:
        statuses = []
        for cancel in (False, True):
            tid, rid = await _running(c)
            url = f"/threads/{tid}/runs/{rid}/join"
            params = {"cancel_on_disconnect": "true"} if cancel else {}
            with contextlib.suppress(httpx.ReadTimeout):
                await c.http.client.get(url, params=params, timeout=1.0)
            await asyncio.sleep(3)  # time for the server to notice the client left
            statuses.append((await c.runs.get(tid, rid))["status"])
            if not cancel:
                await c.runs.cancel(tid, rid)
        return statuses

    ours, theirs = pair.both(scenario)

    assert ours == theirs == ["running", "interrupted"]
