"""A replica that goes away loses no run.

Two replicas of ``toolfleet serve`` on one Redis and one PostgreSQL checkpointer, behind a
proxy that sends each connection to the next replica in turn (and to the other when one
refuses), as a Kubernetes Service would. The replica running a run is killed (SIGKILL: a
node lost) or told to stop (SIGTERM: a rolling update) while the run's non-idempotent
tool calls run on the workers, or while its model thinks. The other replica takes the
run over from its checkpoint as attempt 2: each call runs once, the run ends
``success``, and the client's stream, reconnecting through the proxy with its last event
id, ends with the run's output.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from langgraph_sdk import get_client

from orchestrator.bench.links import proxied
from orchestrator.server.keys import Keys
from tests.support.cut_proxy import BalancingProxy, CutProxy
from tests.support.fleet import effects, wait_until
from tests.support.serving import ServerProcess, database_url, prefork_fleet, run, start_server
from tool_workers.contract.settings import Settings

__all__ = ["database_url", "prefork_fleet"]  # fixtures, imported so pytest finds them here

pytestmark = [
    pytest.mark.timeout(240),
    # The SDK warns as it reconnects a join that a stopping replica cut: the point here.
    pytest.mark.filterwarnings("ignore:Request failed, attempting reconnect:UserWarning"),
]

CALL_SECONDS = 6.0
"""How long each tool call takes: the replica goes away while they run."""


class Pair:
    """Two replicas behind one proxy."""

    def __init__(self, servers: list[ServerProcess], proxy: BalancingProxy, token: str) -> None:
        self.servers = servers
        self.proxy = proxy
        self.token = token

    @property
    def url(self) -> str:
        return f"http://{self.proxy.url_host}"

    def client(self) -> Any:
        return get_client(url=self.url, api_key=self.token)

    def running(self, replica: str) -> ServerProcess:
        """The server whose replica id is ``replica`` (``<host>-<pid>-<suffix>``)."""
        (found,) = [s for s in self.servers if s._proc and f"-{s._proc.pid}-" in replica]
        return found

    def kill(self, replica: str) -> None:
        server = self.running(replica)
        assert server._proc is not None
        server._proc.kill()  # no goodbye: its leases, its thread hold, its stream all stay
        server._proc.wait(10)

    def terminate(self, replica: str) -> threading.Thread:
        """SIGTERM the replica, in a thread of its own (it drains, then exits)."""
        server = self.running(replica)
        stopping = threading.Thread(target=server.stop, kwargs={"grace": 60}, daemon=True)
        stopping.start()
        return stopping


@pytest.fixture
def make_pair(
    database_url: str, prefork_fleet: Settings, tmp_path: Path
) -> Iterator[Callable[..., Pair]]:
    """Two replicas behind a proxy, on the module's PostgreSQL schema unless
    ``database_url=None`` (each its own SQLite file then), with 2 s of drain."""
    token = f"tft-token-{uuid.uuid4().hex}"
    servers: list[ServerProcess] = []
    proxies: list[BalancingProxy] = []

    def make(**overrides: Any) -> Pair:
        shared = {"database_url": database_url, "api_tokens": (token,), "drain_seconds": 2.0}
        shared.update(overrides)
        # One after the other: the first creates the checkpoint tables.
        for name in ("a", "b"):
            servers.append(start_server(prefork_fleet, tmp_path / name, name, **shared))
        proxies.append(BalancingProxy([("127.0.0.1", s.port) for s in servers]).start())
        return Pair(servers, proxies[0], token)

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()
        for server in servers:
            server.stop(grace=10)


@pytest.fixture
def pair(make_pair: Callable[..., Pair]) -> Pair:
    return make_pair()


def ask(*calls: tuple[str, dict[str, Any]], model_delay: float = 0.0) -> dict[str, Any]:
    directive: dict[str, Any] = {"calls": [list(c) for c in calls]}
    if model_delay:
        directive["model_delay"] = model_delay
    return {"messages": [{"role": "user", "content": json.dumps(directive)}]}


def charges() -> dict[str, Any]:
    """Three non-idempotent calls of :data:`CALL_SECONDS` each, at once."""
    amounts = (11, 12, 13)
    return ask(*(("charge", {"amount": a, "seconds": CALL_SECONDS}) for a in amounts))


def charged(settings: Settings) -> dict[str, int]:
    """How many times each ``charge`` call of the module's fleet really ran."""
    client = redis.Redis.from_url(settings.own_redis_url)
    try:
        return effects(client, settings, "charge")
    finally:
        client.close()


def checkpointed(url: str, token: str, thread_id: str) -> bool:
    """Whether the thread has a checkpoint (a run's input, once it is in)."""
    history = httpx.post(
        f"{url}/threads/{thread_id}/history",
        json={"limit": 1},
        headers={"X-Api-Key": token},
        timeout=10,
    )
    return bool(history.json())


def ran_once(settings: Settings, before: dict[str, int], n: int) -> None:
    """``n`` new calls ran, each once; those before ran no more."""
    counts = charged(settings)
    new = {k: v for k, v in counts.items() if k not in before}
    assert len(new) == n and set(new.values()) == {1}, counts
    assert {k: counts[k] for k in before} == before


async def latest_attempt(c: Any, tid: str) -> int:
    history = await c.threads.get_history(tid, limit=1)
    return int(history[0]["metadata"].get("run_attempt", 0))


async def stream_through(pair: Pair, payload: dict[str, Any], lose: str) -> dict[str, Any]:
    """Stream a run through the proxy; once it is where it should be lost (its three
    calls dispatched, or its model step begun), take its replica away (``kill`` or
    ``terminate``). Returns what the client saw and what the servers say afterwards."""
    async with pair.client() as c:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        parts: list[Any] = []
        run_id = ""
        stopping: threading.Thread | None = None
        lost_at = 0.0
        async for part in c.runs.stream(
            tid, "agent", input=payload, stream_mode=["values", "custom"]
        ):
            parts.append(part)
            if part.event == "metadata":
                run_id = part.data["run_id"]
            if lost_at:
                continue
            events = [p.data["toolfleet"]["event"] for p in parts if p.event == "custom"]
            in_model = "model_delay" in json.dumps(payload) and part.event == "values"
            if events.count("started") == 3 or in_model:
                replica = (await c.runs.get(tid, run_id))["replica"]
                if lose == "kill":
                    await asyncio.to_thread(pair.kill, replica)
                else:
                    stopping = pair.terminate(replica)
                lost_at = time.monotonic()
        ended_after = time.monotonic() - lost_at
        final = await c.runs.get(tid, run_id)
        state = await c.threads.get_state(tid)
        attempt = await latest_attempt(c, tid)
        thread_after = await c.threads.get(tid)
    if stopping is not None:
        await asyncio.to_thread(stopping.join, 60)
    return {
        "parts": parts,
        "run": final,
        "state": state,
        "attempt": attempt,
        "thread": thread_after,
        "ended_after": ended_after,
        "lost": bool(lost_at),
    }


def assert_finished_once(
    seen: dict[str, Any], settings: Settings, before: dict[str, int], calls: int
) -> None:
    assert seen["lost"], "the run ended before its replica could be taken away"
    assert seen["run"]["status"] == "success", seen["run"]
    assert seen["attempt"] == 2, seen["attempt"]
    assert seen["thread"]["status"] == "idle", seen["thread"]
    answer = seen["state"]["values"]["messages"][-1]["content"]
    assert answer.startswith(f"done: {calls} results"), answer
    assert "cancelled" not in json.dumps(seen["state"]["values"]), seen["state"]["values"]
    values = [p.data for p in seen["parts"] if p.event == "values"]
    assert values and values[-1] == seen["state"]["values"]  # the stream ended with the output
    assert not [p for p in seen["parts"] if p.event == "error"], seen["parts"]
    ran_once(settings, before, calls)


def test_a_streamed_run_whose_replica_is_killed_mid_call_is_taken_over(
    pair: Pair, prefork_fleet: Settings
) -> None:
    """Given a streamed run whose three non-idempotent calls run on the workers, when its
    replica is SIGKILLed, then the other replica takes it over as attempt 2 within the
    lease, attaches to the three calls, and the run ends success with each call run
    once; the client's stream, reconnected through the proxy, ends with the output."""
    before = charged(prefork_fleet)
    seen = run(stream_through(pair, charges(), "kill"))

    assert_finished_once(seen, prefork_fleet, before, 3)
    (survivor,) = [s for s in pair.servers if s._proc and s._proc.poll() is None]
    scraped = httpx.get(f"{survivor.url}/metrics", timeout=10).text
    assert 'toolfleet_server_runs_taken_over_total{outcome="resumed"} 1.0' in scraped
    print(f"\n[replica killed mid-call] the stream ended {seen['ended_after']:.1f} s later")


def test_a_streamed_run_whose_replica_is_stopped_mid_call_is_handed_on(
    pair: Pair, prefork_fleet: Settings
) -> None:
    """Given a streamed run whose three calls run on the workers, when its replica gets
    SIGTERM (a rolling update, 2 s of drain), then the run is handed on, not cancelled:
    no call is revoked or run twice, no "cancelled" result is written, and the run ends
    success on the other replica; the stopped replica exits within its drain and
    the handing on."""
    before = charged(prefork_fleet)
    seen = run(stream_through(pair, charges(), "terminate"))

    assert_finished_once(seen, prefork_fleet, before, 3)
    (survivor,) = [s for s in pair.servers if s._proc is not None]
    scraped = httpx.get(f"{survivor.url}/metrics", timeout=10).text
    assert 'toolfleet_server_runs_taken_over_total{outcome="resumed"} 1.0' in scraped
    stopped = [s for s in pair.servers if s._proc is None]
    # It exited of itself (uvicorn ends on the signal it got), not killed after its grace.
    assert len(stopped) == 1 and stopped[0].returncode in (0, -15), [s.returncode for s in stopped]
    print(f"\n[replica stopped mid-call] the stream ended {seen['ended_after']:.1f} s later")


@pytest.mark.parametrize("lose", ["kill", "terminate"])
def test_a_background_run_lost_in_its_model_step_completes(
    pair: Pair, prefork_fleet: Settings, lose: str
) -> None:
    """Given a background run (``runs.create``) whose model step takes 4 s, when its
    replica is taken away during it, then another replica goes on from the run's
    checkpoint (the step again from its input; or, when a stopped replica finished the
    step as it drained, its call) and the run completes: a join through the proxy
    answers its output, its one call ran once, and ``runs.list`` shows it success."""

    async def scenario() -> dict[str, Any]:
        async with pair.client() as c:
            thread = await c.threads.create()
            tid = thread["thread_id"]
            created = await c.runs.create(
                tid, "agent", input=ask(("charge", {"amount": 7, "seconds": 1}), model_delay=4)
            )
            # In the model step: its input is checkpointed.
            await asyncio.to_thread(wait_until, lambda: checkpointed(pair.url, pair.token, tid))
            if lose == "kill":
                await asyncio.to_thread(pair.kill, created["replica"])
                stopping = None
            else:
                stopping = pair.terminate(created["replica"])
        # A new connection, as a client's next request after a lost one: the proxy sends
        # it to a replica that answers (a kept-alive one to the killed replica is gone).
        async with pair.client() as c:
            joined = await c.runs.join(tid, created["run_id"])
            listed = await c.runs.list(tid)
            attempt = await latest_attempt(c, tid)
        if stopping is not None:
            await asyncio.to_thread(stopping.join, 60)
        return {"joined": joined, "listed": listed, "attempt": attempt}

    before = charged(prefork_fleet)
    seen = run(scenario())

    assert seen["joined"]["messages"][-1]["content"].startswith("done: 1 results: charged 7")
    assert [r["status"] for r in seen["listed"]] == ["success"]
    assert seen["attempt"] == 2
    ran_once(prefork_fleet, before, 1)


@pytest.mark.parametrize(
    "why",
    [
        pytest.param({"database_url": None}, id="checkpoints-not-shared"),
        pytest.param({"run_attempts": 1}, id="attempts-used-up"),
    ],
)
def test_a_lost_run_that_cannot_go_on_ends_error_and_frees_its_thread(
    make_pair: Callable[..., Pair], prefork_fleet: Settings, why: dict[str, Any]
) -> None:
    """Given replicas whose runs cannot be taken over (each with a SQLite file of its
    own, or one attempt per run), when the replica running a background run is killed
    in its calls, then another replica ends the run ``error`` within the lease, saying
    why, while nobody reads it (its record is watched in Redis, not through the API);
    its thread is free then, and a stream joined afterwards ends with that error."""
    pair = make_pair(**why)
    before = charged(prefork_fleet)
    records = redis.Redis.from_url(prefork_fleet.own_redis_url, decode_responses=True)

    async def start() -> tuple[str, dict[str, Any]]:
        async with pair.client() as c:
            thread = await c.threads.create()
            return thread["thread_id"], await c.runs.create(
                thread["thread_id"], "agent", input=charges()
            )

    async def afterwards(tid: str, run_id: str) -> dict[str, Any]:
        async with pair.client() as c:
            return {
                "run": await c.runs.get(tid, run_id),
                "thread": await c.threads.get(tid),
                "parts": [p async for p in c.runs.join_stream(tid, run_id)],
            }

    try:
        tid, created = run(start())
        wait_until(lambda: len(charged(prefork_fleet)) - len(before) == 3, 30, "3 calls started")
        pair.kill(created["replica"])
        killed_at = time.monotonic()
        record = Keys(prefork_fleet.key_prefix).run(created["run_id"])
        wait_until(lambda: records.hget(record, "status") == "error", 40, "the run's error")
        ended_after = time.monotonic() - killed_at
    finally:
        records.close()
    seen = run(afterwards(tid, created["run_id"]))

    print(f"\n[lost run that cannot go on] ended error {ended_after:.1f} s after the kill")
    assert seen["run"]["error"]["error"] == "RunLost", seen["run"]
    reason = "PostgreSQL" if "database_url" in why else "attempts are used up"
    assert reason in seen["run"]["error"]["message"], seen["run"]["error"]
    assert seen["thread"]["status"] == "error", seen["thread"]
    errors = [p for p in seen["parts"] if p.event == "error"]
    assert [e.data["error"] for e in errors] == ["RunLost"], seen["parts"]


def test_a_killed_replicas_queued_run_waits_its_turn_on_the_other(
    pair: Pair, prefork_fleet: Settings
) -> None:
    """Given a thread whose run is in its calls and a second run queued behind it, both
    on replica A, when A is SIGKILLed, then B takes both over: the first goes on from
    its checkpoint, the second keeps its place in line and runs after it, and each of
    the four calls runs once."""
    a = pair.servers[0]
    before = charged(prefork_fleet)

    async def scenario() -> dict[str, Any]:
        async with get_client(url=a.url, api_key=pair.token) as on_a:
            thread = await on_a.threads.create()
            tid = thread["thread_id"]
            first = await on_a.runs.create(tid, "agent", input=charges())
            second = await on_a.runs.create(
                tid, "agent", input=ask(("charge", {"amount": 21, "seconds": 0.5}))
            )
        await asyncio.to_thread(
            wait_until, lambda: len(charged(prefork_fleet)) - len(before) == 3, 30, "3 calls"
        )
        await asyncio.to_thread(pair.kill, first["replica"])
        async with pair.client() as c:
            joined = [await c.runs.join(tid, r["run_id"]) for r in (first, second)]
            runs = {r["run_id"]: r for r in await c.runs.list(tid)}
        return {"joined": joined, "first": runs[first["run_id"]], "second": runs[second["run_id"]]}

    seen = run(scenario())

    assert seen["first"]["status"] == seen["second"]["status"] == "success"
    assert seen["first"]["updated_at"] <= seen["second"]["updated_at"]
    assert seen["joined"][0]["messages"][-1]["content"].startswith("done: 3 results")
    assert seen["joined"][1]["messages"][-1]["content"] == "done: 1 results: charged 21 (run 1)"
    ran_once(prefork_fleet, before, 4)


def test_a_replica_cut_off_from_redis_stops_its_run_before_another_takes_it_over(
    database_url: str, prefork_fleet: Settings, tmp_path: Path
) -> None:
    """Given replica A whose Redis link goes through a proxy, in the 12 s model step of a
    run, when A's link is cut for 25 s, then A stops the run itself before its lease
    lapses (its log says so) and writes no checkpoint after B took the run over: B runs
    the step again and ends the run success, its call run once, and A, back on its
    link, writes nothing more to the run."""
    token = f"tft-token-{uuid.uuid4().hex}"
    shared = {"database_url": database_url, "api_tokens": (token,)}
    url = urlsplit(prefork_fleet.own_redis_url)
    before = charged(prefork_fleet)
    slow_model = ask(("charge", {"amount": 5, "seconds": 0.5}), model_delay=12)
    with CutProxy(url.hostname or "127.0.0.1", url.port or 6379) as link:
        through = proxied(prefork_fleet.own_redis_url, link.port)
        a = start_server(prefork_fleet, tmp_path / "a", "a", broker_url=through, **shared)
        b = start_server(prefork_fleet, tmp_path / "b", "b", **shared)
        try:

            async def start() -> tuple[str, dict[str, Any]]:
                async with get_client(url=a.url, api_key=token) as on_a:
                    tid = (await on_a.threads.create())["thread_id"]
                    return tid, await on_a.runs.create(tid, "agent", input=slow_model)

            tid, created = run(start())
            wait_until(lambda: checkpointed(a.url, token, tid))  # in the model step
            link.cut()
            cut_at = time.monotonic()

            async def on_b() -> tuple[Any, Any, Any]:
                async with get_client(url=b.url, api_key=token) as c:
                    joined = await c.runs.join(tid, created["run_id"])
                    history = await c.threads.get_history(tid, limit=100)
                    return joined, await c.runs.get(tid, created["run_id"]), history

            joined, ended, _ = run(on_b())
            ended_after = time.monotonic() - cut_at
            time.sleep(max(0.0, 25 - ended_after))
            link.heal()
            time.sleep(6)  # A's lease loop runs again on its link
            _, after, history = run(on_b())
        finally:
            b.stop(grace=10)
            a.stop(grace=10)

    print(f"\n[replica cut off] the run ended {ended_after:.1f} s after the cut, on the other")
    assert "stops here: its lease could not be renewed" in a.log(), a.log()[-3000:]
    assert ended["status"] == "success" and ended["replica"] != created["replica"], ended
    assert joined["messages"][-1]["content"] == "done: 1 results: charged 5 (run 1)"
    assert after["updated_at"] == ended["updated_at"] and after["status"] == "success"
    attempts = [h["metadata"].get("run_attempt") for h in history]  # newest first
    assert attempts == sorted(attempts, reverse=True) and attempts[0] == 2, attempts
    ran_once(prefork_fleet, before, 1)


@pytest.mark.parametrize("when", ["as-it-starts", "mid-step"])
def test_a_redis_blip_mid_run_neither_fails_nor_hands_over_the_run(
    database_url: str, prefork_fleet: Settings, tmp_path: Path, when: str
) -> None:
    """Given replica A whose Redis link goes through a proxy, when the link is cut for
    5 s as a run starts (it marks itself running inside the cut: ``after_seconds``) or
    in its 3 s model step (the step ends inside the cut, so its stream part cannot be
    written at once), then A writes what it could not once Redis is back and goes on
    with the run as its first and only attempt: it ends success on A, its call run once,
    every stream part once, and A's log says no run failed or was taken over."""
    token = f"tft-token-{uuid.uuid4().hex}"
    url = urlsplit(prefork_fleet.own_redis_url)
    before = charged(prefork_fleet)
    model = ask(("charge", {"amount": 7, "seconds": 0.2}), model_delay=3)
    after = 2 if when == "as-it-starts" else 0
    with CutProxy(url.hostname or "127.0.0.1", url.port or 6379) as link:
        through = proxied(prefork_fleet.own_redis_url, link.port)
        a = start_server(
            prefork_fleet,
            tmp_path / "a",
            "a",
            broker_url=through,
            database_url=database_url,
            api_tokens=(token,),
        )
        try:

            async def start() -> tuple[str, dict[str, Any]]:
                async with get_client(url=a.url, api_key=token) as c:
                    tid = (await c.threads.create())["thread_id"]
                    created = await c.runs.create(tid, "agent", input=model, after_seconds=after)
                    return tid, created

            tid, created = run(start())
            if not after:
                wait_until(lambda: checkpointed(a.url, token, tid))  # in the model step
            link.cut()
            time.sleep(5)
            link.heal()

            async def finish() -> tuple[Any, Any, list[Any], list[Any]]:
                async with get_client(url=a.url, api_key=token) as c:
                    joined = await c.runs.join(tid, created["run_id"])
                    parts = [p async for p in c.runs.join_stream(tid, created["run_id"])]
                    history = await c.threads.get_history(tid, limit=100)
                    return joined, await c.runs.get(tid, created["run_id"]), parts, history

            joined, ended, parts, history = run(finish())
        finally:
            a.stop(grace=10)

    log = a.log()
    assert " failed" not in log and "taking over" not in log, log[-3000:]
    assert ended["status"] == "success" and ended["replica"] == created["replica"], ended
    assert joined["messages"][-1]["content"] == "done: 1 results: charged 7 (run 1)"
    assert {h["metadata"].get("run_attempt") for h in history} == {1}, history
    ids = [p.id for p in parts if p.id]
    assert len(ids) == len(set(ids)), ids
    values = [json.dumps(p.data, sort_keys=True) for p in parts if p.event == "values"]
    assert len(values) == len(set(values)), values  # each state once: no part written twice
    ran_once(prefork_fleet, before, 1)
