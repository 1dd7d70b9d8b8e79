"""Runs by the handful (``runs.create_batch``, ``runs.cancel_many``) against LangGraph's
server: the same ``langgraph-sdk`` calls to both servers, compared; then another tenant
can neither cancel a tenant's runs nor find them by status."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.api_pair import ApiPair, api_pair, shape, status_of
from tests.support.serving import prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

OTHER = f"tft-other-{uuid.uuid4().hex}"

SLOW = {
    "messages": [
        {"role": "user", "content": json.dumps({"calls": [["sleep_for", {"seconds": 20}]]})}
    ]
}
"""Input on which the fleet graph's one tool call sleeps on a worker for 20 s."""

RUN_KEYS = {"run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status"}
RUN_KEYS |= {"metadata", "multitask_strategy", "kwargs"}
"""The fields of a ``Run`` both servers answer (each adds some of its own)."""


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}", OTHER))


async def running(c: Any) -> tuple[str, str]:
    """A thread and its run of the fleet graph, in its tool call."""
    thread = await c.threads.create()
    started = await c.runs.create(thread["thread_id"], "fleet", input=SLOW)
    return thread["thread_id"], started["run_id"]


def test_batch_starts_stateless_runs(pair: ApiPair) -> None:
    """When a batch of two made runs is started, then both servers answer two runs on two
    threads of their own, which both succeed. The threads are kept: a stateless run's
    thread is deleted when it ends, and LangGraph's server then answers a join that comes
    after the end with an empty body."""

    async def scenario(c: Any) -> tuple[list[Any], list[str]]:
        made = {"assistant_id": "made", "input": {}, "on_completion": "keep"}
        runs = await c.runs.create_batch([made, dict(made)])
        finished = []
        for r in runs:
            await c.runs.join(r["thread_id"], r["run_id"])
            finished.append("joined")
        return runs, finished

    ours, theirs = pair.both(scenario)

    for runs, finished in (ours, theirs):
        assert len(runs) == 2 and len({r["thread_id"] for r in runs}) == 2
        assert finished == ["joined", "joined"]
    pick = lambda r: {k: v for k, v in r.items() if k in RUN_KEYS}  # noqa: E731
    assert shape(pick(ours[0][0]))["status"] == shape(pick(theirs[0][0]))["status"]
    assert set(pick(ours[0][0])) == set(pick(theirs[0][0])) == RUN_KEYS


def test_cancel_many_by_ids_and_by_status(pair: ApiPair) -> None:
    """Given two runs in a tool call, when one is cancelled by thread and id and the
    other by status, then both end interrupted; a cancel matching no run is 404."""

    async def scenario(c: Any) -> list[Any]:
        tid, rid = await running(c)
        tid2, rid2 = await running(c)
        await c.runs.cancel_many(thread_id=tid, run_ids=[rid])
        first = await c.runs.join(tid, rid)  # noqa: F841 - waits for the end
        await c.runs.cancel_many(status="all")
        await c.runs.join(tid2, rid2)
        statuses = [
            (await c.runs.get(tid, rid))["status"],
            (await c.runs.get(tid2, rid2))["status"],
        ]
        nothing = await status_of(c.runs.cancel_many(thread_id=tid, run_ids=[str(uuid.uuid4())]))
        return [statuses, nothing]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [["interrupted", "interrupted"], 404]


def test_bad_selections_are_422(pair: ApiPair) -> None:
    """Given a status with a thread id, no selection at all, an unknown status, an empty
    batch: then both servers answer 422."""

    async def scenario(c: Any) -> list[int]:
        tid = str(uuid.uuid4())
        return [
            await status_of(c.http.post("/runs/cancel", json={"status": "all", "thread_id": tid})),
            await status_of(c.http.post("/runs/cancel", json={})),
            await status_of(c.http.post("/runs/cancel", json={"status": "sleeping"})),
            await status_of(c.http.post("/runs/batch", json=[{"input": {}}])),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [422, 422, 422, 422]


def test_another_tenant_cannot_cancel(pair: ApiPair) -> None:
    """Given a tenant's run in a tool call, then another tenant's cancel by its ids is
    404 and by status finds nothing (404); the run goes on until its owner cancels it."""

    async def scenario() -> tuple[list[int], str, str]:
        async with (
            pair.client(pair.toolfleet) as mine,
            pair.client(pair.toolfleet, OTHER) as theirs,
        ):
            tid, rid = await running(mine)
            refused = [
                await status_of(theirs.runs.cancel_many(thread_id=tid, run_ids=[rid])),
                await status_of(theirs.runs.cancel_many(status="all")),
            ]
            still = (await mine.runs.get(tid, rid))["status"]
            await mine.runs.cancel_many(thread_id=tid, run_ids=[rid])
            await mine.runs.join(tid, rid)
            return refused, still, (await mine.runs.get(tid, rid))["status"]

    refused, still, after = run(scenario())

    assert refused == [404, 404]
    assert still in ("pending", "running")
    assert after == "interrupted"
