"""Crons, against LangGraph's server: the seven operations of langgraph-sdk's
``client.crons`` (and ``GET /runs/crons/{id}``) on ``toolfleet serve`` and ``langgraph
dev`` (whose in-memory runtime runs crons too), a cron that fires runs that complete,
tenancy, refused fields, and two replicas on one Redis firing each tick once, the
crons going on when the replica that fired them is killed."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api_pair import PROJECT, ApiPair, api_pair, shape, status_of
from tests.support.fleet import new_namespace, wait_until
from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(300)

TOKENS = (f"tft-crons-a-{uuid.uuid4().hex}", f"tft-crons-b-{uuid.uuid4().hex}")

YEARLY = "0 0 1 1 *"
"""A schedule that does not fire during a test."""


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    # Ticks every 2 s, as langgraph dev allows (toolfleet's default minimum is a minute).
    yield from api_pair(prefork_fleet, tmp_path_factory, TOKENS, cron_min_interval=1)


def test_the_seven_cron_operations_answer_alike(pair: ApiPair) -> None:
    """Given a thread, when a cron is made on it and a stateless one, read, searched,
    counted, updated and deleted through langgraph-sdk, then both servers answer the
    same shapes and the same values."""

    async def scenario(c: Any) -> dict[str, Any]:
        tag = {"test": uuid.uuid4().hex}
        tid = (await c.threads.create())["thread_id"]
        on_thread = await c.crons.create_for_thread(
            tid, "made", schedule=YEARLY, input={}, metadata=tag
        )
        loose = await c.crons.create(
            "made", schedule=YEARLY, input={}, metadata=tag, on_run_completed="keep"
        )
        got = await c.http.get(f"/runs/crons/{loose['cron_id']}")
        found = await c.crons.search(metadata=tag)
        on_it = await c.crons.search(thread_id=tid)
        counted = await c.crons.count(metadata=tag)
        counted_thread = await c.crons.count(thread_id=tid)
        updated = await c.crons.update(
            loose["cron_id"], schedule="0 0 2 1 *", enabled=False, metadata={"more": 1}
        )
        disabled = await c.crons.search(metadata=tag, enabled=False)
        selected = await c.crons.search(metadata=tag, select=["cron_id", "schedule"])
        await c.crons.delete(on_thread["cron_id"])
        after = await c.crons.count(metadata=tag)
        gone = await status_of(c.http.get(f"/runs/crons/{on_thread['cron_id']}"))
        again = await status_of(c.crons.delete(on_thread["cron_id"]))
        await c.crons.delete(loose["cron_id"])
        return {
            "on_thread": on_thread,
            "loose": loose,
            "got_same": got["cron_id"] == loose["cron_id"],
            "found": len(found),
            "found_newest_first": [x["cron_id"] for x in found]
            == [loose["cron_id"], on_thread["cron_id"]],
            "on_it": [x["cron_id"] for x in on_it] == [on_thread["cron_id"]],
            "thread_of_cron": on_thread["thread_id"] == tid and loose["thread_id"] is None,
            "counted": (counted, counted_thread),
            "updated": (updated["schedule"], updated["enabled"], updated["metadata"]),
            "disabled": [x["cron_id"] for x in disabled] == [loose["cron_id"]],
            "selected": sorted(selected[0]),
            "after": after,
            "gone": (gone, again),
        }

    ours, theirs = pair.both(scenario)

    for result in (ours, theirs):
        assert result["got_same"] and result["found"] == 2, result
        assert result["found_newest_first"] and result["on_it"], result
        assert result["thread_of_cron"], result
        assert result["counted"] == (2, 1), result
        assert result["updated"][:2] == ("0 0 2 1 *", False), result
        assert result["updated"][2]["more"] == 1 and "test" in result["updated"][2], result
        assert result["disabled"], result
        assert result["selected"] == ["cron_id", "schedule"], result
        assert result["after"] == 1, result
        assert result["gone"] == (404, 404), result
    for key in ("on_thread", "loose"):
        missing = set(theirs[key]) - set(ours[key])
        assert not missing, f"{key}: fields LangGraph's server answers and toolfleet not: {missing}"
        common = set(theirs[key]) & set(ours[key]) - {"payload", "metadata"}
        assert {k: shape(ours[key][k]) for k in common} == {
            k: shape(theirs[key][k]) for k in common
        }, (ours[key], theirs[key])
    assert ours["loose"]["on_run_completed"] == theirs["loose"]["on_run_completed"] == "keep"


def test_a_cron_fires_runs_that_complete(pair: ApiPair) -> None:
    """Given a cron on a thread every 2 seconds (six fields, seconds last), when the
    tests wait, then both servers start runs on the thread that succeed; once the cron
    is deleted no more runs come."""

    async def scenario(c: Any) -> dict[str, Any]:
        tid = (await c.threads.create())["thread_id"]
        cron = await c.crons.create_for_thread(tid, "made", schedule="* * * * * */2", input={})
        deadline = time.monotonic() + 60
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            runs = await c.runs.list(tid)
            if sum(r["status"] == "success" for r in runs) >= 2:
                break
            await asyncio.sleep(0.5)
        await c.crons.delete(cron["cron_id"])
        await asyncio.sleep(1.0)  # a run started as it was deleted
        settled = len(await c.runs.list(tid, limit=100))
        await asyncio.sleep(7.0)
        later = len(await c.runs.list(tid, limit=100))
        state = await c.threads.get_state(tid)
        return {
            "succeeded": sum(r["status"] == "success" for r in runs),
            "stopped": later == settled,
            "runs_in_state": state["values"].get("runs", 0),
        }

    ours, theirs = pair.both(scenario)
    for result in (ours, theirs):
        assert result["succeeded"] >= 2, result
        assert result["stopped"], result
        assert result["runs_in_state"] >= 2, result


def test_a_tenant_sees_only_its_own_crons(pair: ApiPair) -> None:
    """Given a cron of tenant A, then tenant B gets 404 reading, changing or deleting
    it, and finds or counts none of A's; A still has it."""
    server = pair.toolfleet
    a, b = (httpx.Client(base_url=server.url, headers={"X-Api-Key": t}, timeout=30) for t in TOKENS)
    with a, b:
        tag = {"tenant-test": uuid.uuid4().hex}
        cron = a.post(
            "/runs/crons",
            json={"assistant_id": "made", "schedule": YEARLY, "input": {}, "metadata": tag},
        ).json()
        path = f"/runs/crons/{cron['cron_id']}"
        assert b.get(path).status_code == 404
        assert b.patch(path, json={"enabled": False}).status_code == 404
        assert b.delete(path).status_code == 404
        assert b.post("/runs/crons/search", json={"metadata": tag}).json() == []
        assert b.post("/runs/crons/count", json={"metadata": tag}).json() == 0
        assert a.get(path).json()["enabled"] is True
        assert a.post("/runs/crons/count", json={"metadata": tag}).json() == 1
        assert a.delete(path).status_code == 204


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"checkpoint_during": True}, "checkpoint_during"),
        ({"schedule": "every minute"}, "schedule"),
        ({"schedule": "61 * * * *"}, "schedule"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"webhook": "http://10.0.0.1/hook"}, "webhook"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_a_cron_field_not_carried_out_is_a_422_naming_it(
    pair: ApiPair, body: dict[str, Any], named: str
) -> None:
    """Given a cron request with a field toolfleet does not carry out, or a bad value,
    then it is refused with a 422 whose detail names the field, and no cron is made."""
    server = pair.toolfleet
    headers = {"X-Api-Key": TOKENS[0]}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        tag = {"refused": uuid.uuid4().hex}
        request = {"assistant_id": "made", "schedule": YEARLY, "metadata": tag, **body}
        answer = http.post("/runs/crons", json=request)
        assert answer.status_code == 422, answer.text
        assert named in answer.json()["detail"], answer.text
        assert http.post("/runs/crons/count", json={"metadata": tag}).json() == 0


def test_a_thread_cron_refuses_on_run_completed(pair: ApiPair) -> None:
    """Given a thread, when a cron on it names ``on_run_completed`` (a stateless cron's
    field: the thread of a thread's cron is kept), then it is a 422 naming the field."""
    with httpx.Client(
        base_url=pair.toolfleet.url, headers={"X-Api-Key": TOKENS[0]}, timeout=30
    ) as http:
        thread = http.post("/threads", json={}).json()["thread_id"]
        answer = http.post(
            f"/threads/{thread}/runs/crons",
            json={"assistant_id": "made", "schedule": YEARLY, "on_run_completed": "keep"},
        )
        assert answer.status_code == 422, answer.text
        assert "on_run_completed" in answer.json()["detail"], answer.text


@contextlib.contextmanager
def _two_replicas_with_a_cron(
    prefork_fleet: Settings, workdir: Path, **overrides: Any
) -> Iterator[tuple[list[ServerProcess], list[httpx.Client], str, dict[str, Any]]]:
    """Two replicas on one Redis, in a namespace of their own (the module's other server
    must not take the lock), and a cron every 2 seconds on a thread: the servers, a
    client of each, the thread's id and the cron."""
    token = f"tft-crons-r-{uuid.uuid4().hex}"
    namespace = new_namespace()
    servers: list[ServerProcess] = []
    try:
        with contextlib.ExitStack() as stack:
            for name in ("one", "two"):
                servers.append(
                    start_server(
                        prefork_fleet,
                        workdir,
                        name,
                        args=("--config", str(PROJECT)),
                        model=None,
                        api_tokens=(token,),
                        namespace=namespace,
                        cron_min_interval=1,
                        **overrides,
                    )
                )
            clients = [
                stack.enter_context(
                    httpx.Client(base_url=s.url, headers={"X-Api-Key": token}, timeout=30)
                )
                for s in servers
            ]
            tid = clients[0].post("/threads", json={}).json()["thread_id"]
            cron = (
                clients[0]
                .post(
                    f"/threads/{tid}/runs/crons",
                    json={"assistant_id": "made", "schedule": "* * * * * */2", "input": {}},
                )
                .json()
            )
            yield servers, clients, tid, cron
    finally:
        for server in servers:
            server.stop()


def _runs_since(
    http: httpx.Client, thread_id: str, since: float, count: int, within: float
) -> list[dict[str, Any]]:
    """The thread's runs created after ``since`` (Unix time), once there are ``count`` of
    them, or all there are after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        runs = [
            r
            for r in http.get(f"/threads/{thread_id}/runs", params={"limit": 100}).json()
            if datetime.fromisoformat(r["created_at"]).timestamp() > since
        ]
        if len(runs) >= count or time.monotonic() >= deadline:
            return runs
        time.sleep(0.5)


def test_two_replicas_fire_each_tick_once_and_survive_a_kill(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Given two replicas on one Redis and a cron every 2 seconds on a thread, then
    each tick makes one run (never two within a tick), all on the replica holding the
    schedule's lock; when that replica is killed (SIGKILL, no goodbye), the other takes
    the crons over and its runs follow."""
    workdir = tmp_path_factory.mktemp("crons-replicas")
    with _two_replicas_with_a_cron(prefork_fleet, workdir) as (servers, clients, tid, cron):
        runs = _wait_for_runs(clients[0], tid, 4)
        # Never two runs of one tick. Read by the tick each run was started for, not by
        # the times the runs were made: a tick may fire late on a loaded machine (seen:
        # the first by 2 s, when beat saw the new cron at its next wake), and then the
        # next one comes a moment after it.
        ids = {r["run_id"] for r in runs}

        def logged() -> dict[str, str] | None:
            found = _ticks_of(servers)
            return found if ids <= found.keys() else None

        ticks = wait_until(logged, 10, "each run's tick in the replicas' logs")
        fired = [ticks[run_id] for run_id in ids]
        assert len(set(fired)) == len(fired), fired
        holders = {r["replica"] for r in runs}
        assert len(holders) == 1, holders  # the lock's holder fires them all
        holder = next(i for i, s in enumerate(servers) if _replica_of(s, holders))
        survivor = clients[1 - holder]
        assert servers[holder]._proc is not None
        servers[holder]._proc.kill()  # no shutdown: the lock is never released
        servers[holder]._proc.wait(10)
        later = _runs_since(survivor, tid, time.time(), 2, within=60)
        assert len(later) >= 2, later
        assert {r["replica"] for r in later}.isdisjoint(holders), later
        assert survivor.delete(f"/runs/crons/{cron['cron_id']}").status_code == 204
        started = time.monotonic()
        servers[1 - holder].stop()  # the lock's holder now: it releases it and stops
        assert time.monotonic() - started < 15.0  # its beat's sleep, not the stop's grace


def test_a_draining_replica_hands_its_crons_to_the_other_at_once(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Given two replicas with 20 s of drain and a cron every 2 s on a thread, when the
    replica firing it gets SIGTERM while a client holds a stream open on it (so it
    drains to the end), then the other replica fires the next ticks within seconds,
    while the first still drains: its beat lets the lock go as the drain begins."""
    workdir = tmp_path_factory.mktemp("crons-drain")
    with _two_replicas_with_a_cron(prefork_fleet, workdir, drain_seconds=20.0) as (
        servers,
        clients,
        tid,
        cron,
    ):
        holders = {r["replica"] for r in _wait_for_runs(clients[0], tid, 2)}
        holder = next(i for i, s in enumerate(servers) if _replica_of(s, holders))
        draining, survivor = servers[holder], clients[1 - holder]
        quiet = survivor.post("/threads", json={}).json()["thread_id"]
        opened = threading.Event()

        def hold_stream() -> None:  # open until the draining replica cuts it
            with (
                contextlib.suppress(httpx.HTTPError),
                httpx.stream(
                    "GET",
                    f"{draining.url}/threads/{quiet}/stream",
                    headers=dict(survivor.headers),
                    timeout=60,
                ) as response,
            ):
                opened.set()
                for _ in response.iter_bytes():
                    pass

        threading.Thread(target=hold_stream, daemon=True).start()
        assert opened.wait(10)
        stopping = threading.Thread(target=draining.stop, kwargs={"grace": 40}, daemon=True)
        stopping.start()
        later = _runs_since(survivor, tid, time.time(), 2, within=15)
        assert stopping.is_alive()  # still draining
        assert len(later) >= 2 and {r["replica"] for r in later}.isdisjoint(holders), later
        assert survivor.delete(f"/runs/crons/{cron['cron_id']}").status_code == 204
        stopping.join(45)


def _wait_for_runs(http: httpx.Client, thread_id: str, count: int) -> list[dict[str, Any]]:
    """The thread's runs once there are at least ``count`` (within a minute)."""
    deadline = time.monotonic() + 60
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = http.get(f"/threads/{thread_id}/runs", params={"limit": 100}).json()
        if len(runs) >= count:
            return runs
        time.sleep(0.5)
    raise AssertionError(f"{len(runs)} runs within a minute, not {count}: {runs}")


def _ticks_of(servers: list[ServerProcess]) -> dict[str, str]:
    """The tick each run a cron started was for (run id -> tick), from the replicas'
    logs."""
    started = re.compile(r"cron \S+: tick (\S+) started run (\S+)")
    return {
        run: tick
        for server in servers
        for tick, run in started.findall(server.log_file.read_text(errors="replace"))
    }


def _replica_of(server: ServerProcess, holders: set[str]) -> bool:
    """Whether ``server`` is the replica named in ``holders`` (a replica's id is its
    host, its pid and a random suffix)."""
    assert server._proc is not None
    return any(f"-{server._proc.pid}-" in h for h in holders)
