"""Thread endpoints beyond create/read/search, against LangGraph's server: the same
``langgraph-sdk`` calls to ``toolfleet serve`` and ``langgraph dev`` on one project, their
answers compared by shape and status; then what only a multi-tenant server has to show."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestrator.server.keys import Keys
from tests.support.api_pair import THREAD_GAPS, ApiPair, api_pair, drop, shape, status_of
from tests.support.serving import prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

OTHER = f"tft-other-{uuid.uuid4().hex}"
"""A second tenant's token on toolfleet's server."""


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}", OTHER))


def test_update_merges_metadata(pair: ApiPair) -> None:
    """Given a thread with metadata, when threads.update sets one key and adds another,
    then both servers answer the thread with the merged metadata, in the same shape."""

    async def scenario(c: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
        thread = await c.threads.create(metadata={"a": 1, "b": "x"})
        updated = await c.threads.update(thread["thread_id"], metadata={"b": "y", "c": [1]})
        again = await c.threads.get(thread["thread_id"])
        missing = await status_of(c.threads.update(str(uuid.uuid4()), metadata={"a": 2}))
        return updated, again, missing

    ours, theirs = pair.both(scenario)

    for updated, again, missing in (ours, theirs):
        assert updated["metadata"] == {"a": 1, "b": "y", "c": [1]}
        assert again["metadata"] == updated["metadata"]
        assert missing == 404
        assert shape(updated) == shape(again)  # a Thread, as the server's others
    assert shape(drop(ours[0], *THREAD_GAPS)) == shape(drop(theirs[0], *THREAD_GAPS))


def test_count_with_metadata_and_status(pair: ApiPair) -> None:
    """Given three threads, two tagged alike, when threads.count filters by the tag (and
    by status), then both servers count the same."""
    tag = uuid.uuid4().hex

    async def scenario(c: Any) -> list[Any]:
        for n in range(3):
            await c.threads.create(metadata={"tag": tag if n < 2 else "other", "n": n})
        return [
            await c.threads.count(metadata={"tag": tag}),
            await c.threads.count(metadata={"tag": tag, "n": 1}),
            await c.threads.count(metadata={"tag": tag}, status="idle"),
            await c.threads.count(metadata={"tag": tag}, status="busy"),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [2, 1, 2, 0]


def test_update_state_writes_a_checkpoint_as_the_node(pair: ApiPair) -> None:
    """Given a thread the made graph ran once, when threads.update_state writes values as
    its node, then the new checkpoint is the thread's latest, with the values reduced as
    the node's own output (runs: 1 + 5); forking from the first checkpoint works too."""

    async def scenario(c: Any) -> tuple[Any, ...]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        await c.runs.wait(tid, "made", input={})
        first = await c.threads.get_state(tid)
        written = await c.threads.update_state(tid, {"runs": 5, "marker": "edited"}, as_node="note")
        state = await c.threads.get_state(tid)
        fork = await c.threads.update_state(
            tid, {"runs": 10}, as_node="note", checkpoint_id=first["checkpoint"]["checkpoint_id"]
        )
        forked = await c.threads.get_state(tid, checkpoint_id=fork["checkpoint_id"])
        untagged = await c.threads.create()
        no_graph = await status_of(c.threads.update_state(untagged["thread_id"], {"runs": 1}))
        missing = await status_of(c.threads.update_state(str(uuid.uuid4()), {"runs": 1}))
        return tid, written, state, forked, no_graph, missing

    ours, theirs = pair.both(scenario)

    for tid, written, state, forked, no_graph, missing in (ours, theirs):
        assert written["checkpoint"]["thread_id"] == tid
        assert state["checkpoint"]["checkpoint_id"] == written["checkpoint_id"]
        assert state["values"]["runs"] == 6 and state["values"]["marker"] == "edited"
        assert forked["values"]["runs"] == 11
        assert (no_graph, missing) == (400, 404)
    assert shape(ours[1]) == shape(theirs[1])


def test_copy_has_the_same_checkpoints(pair: ApiPair) -> None:
    """Given a thread the made graph ran twice, when it is copied, then the copy is a new
    idle thread with the same metadata, values and history, and a run on the copy leaves
    the original as it was."""

    async def scenario(c: Any) -> tuple[Any, ...]:
        thread = await c.threads.create(metadata={"owner": "me"})
        tid = thread["thread_id"]
        for _ in range(2):
            await c.runs.wait(tid, "made", input={})
        copy = await c.threads.copy(tid)
        history = await c.threads.get_history(tid, limit=50)
        copied = await c.threads.get_history(copy["thread_id"], limit=50)
        await c.runs.wait(copy["thread_id"], "made", input={})
        original = await c.threads.get_state(tid)
        after = await c.threads.get_state(copy["thread_id"])
        missing = await status_of(c.threads.copy(str(uuid.uuid4())))
        return tid, copy, history, copied, original, after, missing

    ours, theirs = pair.both(scenario)

    for tid, copy, history, copied, original, after, _ in (ours, theirs):
        assert copy["thread_id"] != tid and copy["status"] == "idle"
        assert copy["metadata"]["owner"] == "me"
        assert [s["values"] for s in copied] == [s["values"] for s in history]
        assert [s["checkpoint"]["checkpoint_id"] for s in copied] == [
            s["checkpoint"]["checkpoint_id"] for s in history
        ]
        assert {s["checkpoint"]["thread_id"] for s in copied} == {copy["thread_id"]}
        assert (original["values"]["runs"], after["values"]["runs"]) == (2, 3)
    assert ours[-1] == 404  # LangGraph's server answers 409 for a thread it does not have
    # LangGraph's server answers the copy without its values; toolfleet's with them.
    assert shape(drop(ours[1], *THREAD_GAPS, "values")) == shape(
        drop(theirs[1], *THREAD_GAPS, "values")
    )


def test_another_tenant_cannot_touch_the_thread(pair: ApiPair) -> None:
    """Given a thread of one tenant, then another tenant's update, copy and state edit
    of it answer 404, its count does not include it, and the thread is unchanged."""
    tag = uuid.uuid4().hex

    async def scenario() -> tuple[list[int], int, dict[str, Any]]:
        async with (
            pair.client(pair.toolfleet) as mine,
            pair.client(pair.toolfleet, OTHER) as theirs,
        ):
            thread = await mine.threads.create(metadata={"tag": tag})
            tid = thread["thread_id"]
            await mine.runs.wait(tid, "made", input={})
            statuses = [
                await status_of(theirs.threads.update(tid, metadata={"tag": "stolen"})),
                await status_of(theirs.threads.copy(tid)),
                await status_of(theirs.threads.update_state(tid, {"runs": 100}, as_node="note")),
            ]
            counted = await theirs.threads.count(metadata={"tag": tag})
            return statuses, counted, await mine.threads.get_state(tid)

    statuses, counted, state = run(scenario())

    assert statuses == [404, 404, 404]
    assert counted == 0
    assert state["values"]["runs"] == 1


def test_bad_bodies_are_422_on_both(pair: ApiPair) -> None:
    """Given malformed bodies (metadata not an object, an unknown status), then both
    servers answer 422."""

    async def scenario(c: Any) -> list[int]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        return [
            await status_of(c.http.patch(f"/threads/{tid}", json={"metadata": "text"})),
            await status_of(c.http.post("/threads/count", json={"status": "sleeping"})),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [422, 422]


def test_prune_deletes_the_threads_it_names(pair: ApiPair) -> None:
    """Given two threads, when threads.prune names them and one that does not exist,
    then both servers count the two pruned, the threads are gone, an empty list prunes
    nothing, and an unknown strategy is a 422."""

    async def scenario(c: Any) -> list[Any]:
        ids = [(await c.threads.create())["thread_id"] for _ in range(2)]
        pruned = await c.threads.prune([*ids, str(uuid.uuid4())])
        gone = [await status_of(c.threads.get(tid)) for tid in ids]
        empty = await c.threads.prune([])
        bad = await status_of(
            c.http.post("/threads/prune", json={"thread_ids": ids, "strategy": "x"})
        )
        missing = await status_of(c.http.post("/threads/prune", json={}))
        return [pruned, gone, empty, bad, missing]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [{"pruned_count": 2}, [404, 404], {"pruned_count": 0}, 422, 422]


def test_storage_reports_the_threads_checkpoints(pair: ApiPair) -> None:
    """Given a thread the made graph ran on twice, when its storage is read, then both
    servers answer the same report: checkpoints, channel values by channel and pending
    writes, each counted and sized; an unknown thread is a 404."""

    async def scenario(c: Any) -> list[Any]:
        tid = (await c.threads.create())["thread_id"]
        for _ in range(2):
            await c.runs.wait(tid, "made", input={})
        report = await c.http.get(f"/threads/{tid}/storage")
        missing = await status_of(c.http.get(f"/threads/{uuid.uuid4()}/storage"))
        return [report, missing]

    ours, theirs = pair.both(scenario)

    assert shape(ours) == shape(theirs)
    assert ours[1] == theirs[1] == 404
    report = ours[0]
    assert report["checkpoints"]["count"] == theirs[0]["checkpoints"]["count"] > 0
    assert report["channel_values"]["count"] > 0
    assert set(report["channel_values"]["by_channel"]) == set(
        theirs[0]["channel_values"]["by_channel"]
    )
    parts = ("checkpoints", "channel_values", "pending_writes")
    assert report["total_bytes"] == sum(report[p]["bytes"] for p in parts) > 0


def test_join_stream_honours_stream_modes(pair: ApiPair) -> None:
    """Given a thread whose resumable run is over, when a client joins its stream after
    the run's first part with ``stream_modes=lifecycle`` (the name LangGraph's server
    reads), then both servers send only the run's closing metadata."""

    async def scenario(c: Any) -> list[tuple[str, Any]]:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid, "made", input={}, stream_mode=["values", "updates"], stream_resumable=True
            )
        ]
        first = next(p for p in parts if p.id and p.event != "metadata")
        return await asyncio.wait_for(
            joined(c, tid, 1, last_event_id=first.id, params={"stream_modes": "lifecycle"}), 30
        )

    ours, theirs = pair.both(scenario)

    assert [e for e, _ in ours] == [e for e, _ in theirs] == ["metadata"]
    assert ours[0][1]["status"] == theirs[0][1]["status"] == "run_done"


async def joined(c: Any, tid: str, runs: int, **kwargs: Any) -> list[tuple[str, Any]]:
    """The thread stream's events until ``runs`` runs are done: (event, data) pairs."""
    seen: list[tuple[str, Any]] = []
    async for part in await c.threads.join_stream(tid, **kwargs):
        seen.append((part.event, part.data))
        done = [d for e, d in seen if e == "metadata" and d.get("status") == "run_done"]
        if len(done) == runs:
            break
    return seen


def test_join_stream_follows_the_threads_runs(pair: ApiPair) -> None:
    """Given a client joined to a thread's stream, when two runs of the made graph run on
    it one after the other, then both servers send each run's events from its metadata to
    its run_done, in the same sequence, the second run's values counting two runs."""

    async def scenario(c: Any) -> list[tuple[str, Any]]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        listening = asyncio.create_task(joined(c, tid, 2))
        await asyncio.sleep(1.0)  # joined before the runs start
        for _ in range(2):
            await c.runs.wait(tid, "made", input={})
        return await asyncio.wait_for(listening, 30)

    ours, theirs = pair.both(scenario)

    def sequence(events: list[tuple[str, Any]]) -> list[str]:
        return [e if e != "metadata" else f"metadata:{sorted(d)}" for e, d in events]

    assert sequence(ours) == sequence(theirs)
    assert [d["runs"] for e, d in ours if e == "values"][-1] == 2


def test_join_stream_of_another_tenants_thread_is_404(pair: ApiPair) -> None:
    """Given one tenant's thread its owner follows, then another tenant joining its
    stream gets 404, while the owner sees its run through to the end."""

    async def scenario() -> tuple[int, list[str]]:
        async with (
            pair.client(pair.toolfleet) as mine,
            pair.client(pair.toolfleet, OTHER) as theirs,
        ):
            thread = await mine.threads.create()
            tid = thread["thread_id"]
            listening = asyncio.create_task(joined(mine, tid, 1))
            refused = await status_of(joined(theirs, tid, 1))
            await asyncio.sleep(1.0)  # joined before the run starts
            await mine.runs.wait(tid, "made", input={})
            return refused, [e for e, _ in await asyncio.wait_for(listening, 30)]

    refused, events = run(scenario())

    assert refused == 404
    assert events[0] == events[-1] == "metadata" and "values" in events


def test_join_stream_resumes_after_last_event_id(pair: ApiPair) -> None:
    """Given a thread whose run is over, when a client joins its stream with the id of
    the run's first logged part, then it gets the run's later parts again (neither that
    part nor the run's opening metadata), then the run's end, on both servers; a
    Last-Event-ID that is no event id is 422 here."""

    async def scenario(c: Any) -> tuple[list[str], list[str]]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid, "made", input={}, stream_mode=["values", "updates"], stream_resumable=True
            )
        ]
        logged = [p for p in parts if p.id and p.event != "metadata"]
        resumed = await asyncio.wait_for(joined(c, tid, 1, last_event_id=logged[0].id), 30)
        return [p.event for p in logged][1:], [e for e, _ in resumed]

    ours, theirs = pair.both(scenario)

    sent, resumed = ours
    assert resumed == [*sent, "metadata"]  # the run's start is before the id: not again
    # LangGraph's in-memory server gives two parts of one millisecond the same id
    # (<ms>-0), and resuming after the first skips both: its answer is a tail of ours.
    sent, resumed = theirs
    assert resumed == [*sent, "metadata"][-len(resumed) :] and resumed[-1] == "metadata"

    async def bad_id() -> int:
        async with pair.client(pair.toolfleet) as c:
            thread = await c.threads.create()
            return await status_of(joined(c, thread["thread_id"], 1, last_event_id="x"))

    assert run(bad_id()) == 422


SORTS: list[dict[str, Any]] = [
    {},  # the default: the most recently updated first
    {"sort_by": "created_at"},
    {"sort_by": "created_at", "sort_order": "asc"},
    {"sort_by": "updated_at", "sort_order": "asc"},
    {"sort_by": "state_updated_at"},
    {"sort_by": "status", "sort_order": "asc"},
]


def test_search_sorts_as_asked(pair: ApiPair) -> None:
    """Given three threads created one after the other, the first then updated, when
    threads.search sorts by each field and order (and by default), then both servers
    list them in the same order."""
    tag = uuid.uuid4().hex

    async def scenario(c: Any) -> list[list[int]]:
        made = []
        for n in range(3):
            made.append(await c.threads.create(metadata={"tag": tag, "n": n}))
            await asyncio.sleep(0.05)  # distinct creation times
        await c.threads.update(made[0]["thread_id"], metadata={"touched": True})
        orders = []
        for sort in SORTS:
            found = await c.threads.search(metadata={"tag": tag}, **sort)
            orders.append([t["metadata"]["n"] for t in found])
        return orders

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours[0] == [0, 2, 1] and ours[2] == [0, 1, 2]


def test_search_of_threads_written_before_the_update_index_lists_them(pair: ApiPair) -> None:
    """Given threads whose update-time index entries are gone (written before that index
    existed), when threads.search lists by update time, then every thread is listed, in
    the order of its updated_at."""
    tag = uuid.uuid4().hex

    async def scenario(c: Any) -> list[int]:
        for n in range(3):
            await c.threads.create(metadata={"tag": tag, "n": n})
            await asyncio.sleep(0.05)
        return [t["metadata"]["n"] for t in await c.threads.search(metadata={"tag": tag})]

    settings = pair.toolfleet.settings
    client = redis.Redis.from_url(settings.own_redis_url)
    try:
        ours, _ = pair.both(scenario)
        pattern = Keys(settings.key_prefix).threads_updated("*")
        for key in list(client.scan_iter(match=pattern)):
            client.delete(key)
        listed = run(listing(pair, tag))
    finally:
        client.close()
    assert ours == [2, 1, 0]
    assert listed == [2, 1, 0]


async def listing(pair: ApiPair, tag: str) -> list[int]:
    async with pair.client(pair.toolfleet) as c:
        return [t["metadata"]["n"] for t in await c.threads.search(metadata={"tag": tag})]
