"""The thread-centric protocol (``client.threads.stream``: ``POST /threads/{id}/commands``
and ``POST /threads/{id}/stream/events``) against LangGraph's server: the same
langgraph-sdk calls to ``toolfleet serve`` and ``langgraph dev`` on one project (the
fleet agent, and ``approval``, which stops for an answer)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from orchestrator.server.keys import Keys
from tests.support.api_pair import ApiPair, api_pair, shape
from tests.support.fleet import REPO
from tests.support.serving import prefork_fleet
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

PROJECT = REPO / "tests" / "thread_project" / "langgraph.json"
CHANNELS = ["values", "updates", "messages", "tools", "lifecycle", "input", "custom"]
OTHER_TENANT = f"tft-other-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    tokens = (f"tft-main-{uuid.uuid4().hex}", OTHER_TENANT)
    yield from api_pair(prefork_fleet, tmp_path_factory, tokens, PROJECT)


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Run input whose user message makes the test model call ``calls`` at once."""
    text = json.dumps({"calls": [list(c) for c in calls]})
    return {"messages": [{"role": "user", "content": text}]}


def terminal(event: dict[str, Any]) -> bool:
    """Whether the event ends the run: its root's ``completed``, ``failed`` or
    ``interrupted``, or a request for input (the SDK ends its subscriptions there)."""
    params = event.get("params") or {}
    data = params.get("data") or {}
    if event.get("method") == "input.requested":
        return True
    return (
        event.get("method") == "lifecycle"
        and not params.get("namespace")
        and data.get("event") in ("completed", "failed", "interrupted")
    )


def outline(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a stream says, without ids and times: each event's method, namespace and
    kind (``message-start``, ``running``, ...)."""
    out = []
    for e in events:
        params = e["params"]
        data = params.get("data")
        kind = data.get("event") if isinstance(data, dict) else None
        namespace = tuple(n.split(":")[0] for n in params.get("namespace") or ())
        out.append((e["method"], namespace, kind))
    return out


async def until_terminal(stream: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(60):
        async for event in stream:
            events.append(event)
            if terminal(event):
                break
    return events


def test_a_run_started_and_streamed_through_thread_commands(pair: ApiPair) -> None:
    """Given a new thread id, when ``client.threads.stream`` starts a run with one tool
    call and subscribes to every channel, then both servers stream the same events (the
    lifecycle, values, messages, tools and the tool's message), ``thread.output`` is the
    final values, and the run is the one ``runs.list`` shows, a run like any other."""

    async def scenario(c: Any) -> dict[str, Any]:
        async with c.threads.stream(assistant_id="fleet") as thread:
            started = await thread.run.start(input=ask(("add", {"a": 2, "b": 3})))
            events = await until_terminal(thread.subscribe(CHANNELS))
            output = await thread.output
            runs = await c.runs.list(thread.thread_id)
            state = await c.threads.get_state(thread.thread_id)
        return {
            "outline": outline(events),
            "seqs": [e["seq"] for e in events],
            "values": shape(events[-2]["params"]["data"]),
            "output": [m["type"] for m in output["messages"]],
            "answer": output["messages"][-1]["content"],
            "same_run": [r["run_id"] for r in runs] == [started["run_id"]],
            "run_status": runs[0]["status"],
            "state": [m["type"] for m in state["values"]["messages"]],
        }

    ours, theirs = pair.both(scenario)

    assert ours["outline"] == theirs["outline"], (ours["outline"], theirs["outline"])
    assert ours["outline"][0] == ("lifecycle", (), "running")
    assert ("tools", (), "tool-finished") in ours["outline"]
    assert ours["outline"][-1] == ("lifecycle", (), "completed")
    assert ours["seqs"] == list(range(1, len(ours["seqs"]) + 1))
    for key in ("values", "output", "answer", "same_run", "run_status", "state"):
        assert ours[key] == theirs[key], (key, ours[key], theirs[key])
    assert ours["same_run"] is True and ours["run_status"] == "success"
    assert ours["output"] == ["human", "ai", "tool", "ai"]


def text_of(message: dict[str, Any]) -> str:
    """A message's text, whether its content is a string or a list of blocks."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


@pytest.mark.parametrize("first_by", ["runs.wait", "runs.create"])
def test_a_second_run_on_a_thread_yields_its_own_output(pair: ApiPair, first_by: str) -> None:
    """Given a thread whose first run is over (started by ``runs.wait``, or by
    ``runs.create`` and joined), when ``client.threads.stream`` on that thread starts
    another run, then ``thread.output`` is the new run's final values (the answer to the
    second question), not the state the first run left, on both servers. (A resumable
    first run, as one a thread command starts, is replayed to the client on both
    servers: its ``completed`` then ends the SDK's wait, LangGraph's own behaviour.)"""

    def said(text: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}]}

    async def scenario(c: Any) -> dict[str, Any]:
        tid = (await c.threads.create())["thread_id"]
        if first_by == "runs.wait":
            await c.runs.wait(tid, "fleet", input=said("first"))
        else:
            first = await c.runs.create(tid, "fleet", input=said("first"))
            await c.runs.join(tid, first["run_id"])
        async with c.threads.stream(tid, assistant_id="fleet") as thread:
            await thread.run.start(input=said("second"))
            output = await thread.output.with_timeout(60)
        return {
            "answer": text_of(output["messages"][-1]),
            "count": len(output["messages"]),
        }

    ours, theirs = pair.both(scenario)

    assert theirs == {"answer": "echo: second", "count": 4}
    assert ours == theirs


def test_an_interrupt_answered_with_input_respond(pair: ApiPair) -> None:
    """Given a run of ``approval`` that stops for an answer, when the client sees the
    interrupt (``thread.interrupted``) and answers it with ``thread.run.respond``, then
    the run resumes with that answer on both servers; the interrupt's event, its answer's
    run and the final values are alike, and an interrupt already answered is refused."""

    async def scenario(c: Any) -> dict[str, Any]:
        async with c.threads.stream(assistant_id="approval") as thread:
            await thread.run.start(input={"request": "deploy"})
            async with asyncio.timeout(30):
                while not thread.interrupts:
                    await asyncio.sleep(0.05)
            # Subscribed once the interrupt is known: the SDK ends the subscriptions open
            # when it learns of one, whichever event they had reached.
            first = await until_terminal(thread.subscribe(CHANNELS))
            asked = dict(thread.interrupts[0])
            await thread.run.respond("yes")
            output = await thread.output.with_timeout(60)
            # The same answer again, as a client that missed the first one's answer would.
            params = {"interrupt_id": asked["interrupt_id"], "namespace": [], "response": "no"}
            command = {"id": 99, "method": "input.respond", "params": params}
            again = await c.http.client.post(f"/threads/{thread.thread_id}/commands", json=command)
            runs = await c.runs.list(thread.thread_id)
        requested = [e for e in first if e["method"] == "input.requested"]
        return {
            "outline": outline(first),
            "requested": requested[0]["params"]["data"]["payload"],
            "output": output,
            "again": (again.status_code, again.json().get("error")),
            "runs": [r["status"] for r in runs],
        }

    ours, theirs = pair.both(scenario)

    assert ours["outline"] == theirs["outline"], (ours["outline"], theirs["outline"])
    assert ours["outline"][-1] == ("input.requested", (), None)
    for key in ("requested", "output", "again", "runs"):
        assert ours[key] == theirs[key], (key, ours[key], theirs[key])
    assert ours["requested"] == {"question": "go on with deploy?"}
    assert ours["output"] == {"request": "deploy", "answer": "yes", "done": True}
    assert ours["again"] == (200, "no_such_interrupt")
    assert ours["runs"] == ["success", "success"]


def test_a_reconnect_with_since_gets_only_the_later_events(pair: ApiPair) -> None:
    """Given a finished run on a thread, when its events are read again from the start
    and then after ``since``, then ``seq`` numbers them alike each time and the second
    read starts just after ``since``; a filter by channel keeps the numbering."""

    async def scenario(c: Any) -> dict[str, Any]:
        async with c.threads.stream(assistant_id="fleet") as thread:
            await thread.run.start(input=ask(("add", {"a": 1, "b": 1})))
            await thread.output
            whole = await until_terminal(thread.subscribe(CHANNELS))
        http = c.http.client
        path = f"/threads/{thread.thread_id}/stream/events"

        async def read(body: dict[str, Any]) -> list[dict[str, Any]]:
            events: list[dict[str, Any]] = []
            async with asyncio.timeout(30):
                async with http.stream("POST", path, json=body) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line[6:]))
                            if terminal(events[-1]):
                                break
            return events

        since = whole[len(whole) // 2]["seq"]
        later = await read({"channels": CHANNELS, "since": since})
        lifecycle = await read({"channels": ["lifecycle"]})
        return {
            "whole": [(e["seq"], e["event_id"]) for e in whole],
            "later": [(e["seq"], e["event_id"]) for e in later],
            "since": since,
            "lifecycle": [(e["seq"], e["params"]["data"]["event"]) for e in lifecycle],
        }

    ours, theirs = pair.both(scenario)

    for result in (ours, theirs):
        assert result["later"] == [p for p in result["whole"] if p[0] > result["since"]]
        by_seq = dict(result["whole"])
        assert [seq for seq, _ in result["lifecycle"]] == [
            seq for seq, _ in result["whole"] if by_seq[seq].startswith("synth:")
        ]
    assert [kind for _, kind in ours["lifecycle"]] == [kind for _, kind in theirs["lifecycle"]]
    assert len(ours["whole"]) == len(theirs["whole"])


def test_refusals_alike(pair: ApiPair) -> None:
    """An unknown command is the error ``unknown_command`` (200), a body that is not a
    command a 400, an unknown channel a 400, and an answer to an interrupt the thread
    does not have ``no_such_interrupt``: on both servers. A stream of a thread that does
    not exist is a 404 on toolfleet."""

    def calls(http: httpx.Client) -> dict[str, Any]:
        thread = http.post("/threads", json={}).json()["thread_id"]
        commands = f"/threads/{thread}/commands"
        unknown = http.post(commands, json={"id": 1, "method": "state.get", "params": {}})
        malformed = http.post(commands, json={"id": "one", "method": "run.start"})
        started = http.post(
            commands,
            json={"id": 2, "method": "run.start", "params": {"assistant_id": "approval"}},
        )
        no_assistant = http.post(
            commands, json={"id": 3, "method": "run.start", "params": {"input": {}}}
        )
        bad_channel = http.post(f"/threads/{thread}/stream/events", json={"channels": ["x"]})
        no_channels = http.post(f"/threads/{thread}/stream/events", json={})
        unknown_thread = f"/threads/{uuid.uuid4()}/stream/events"
        with http.stream("POST", unknown_thread, json={"channels": ["values"]}) as response:
            missing = response.status_code
        wrong = http.post(
            commands,
            json={
                "id": 4,
                "method": "input.respond",
                "params": {"interrupt_id": "nope", "namespace": [], "response": 1},
            },
        )
        return {
            "unknown": (unknown.status_code, unknown.json()["type"], unknown.json()["error"]),
            "malformed": (malformed.status_code, malformed.json()["error"]),
            "started": (started.status_code, sorted(started.json()), started.json()["id"]),
            "no_assistant": (no_assistant.status_code, no_assistant.json()["error"]),
            "bad_channel": bad_channel.status_code,
            "no_channels": no_channels.status_code,
            "missing": missing,
            "wrong": (wrong.status_code, wrong.json().get("error")),
        }

    results = []
    for server in (pair.toolfleet, pair.langgraph):
        headers = {}
        if server is pair.toolfleet:
            headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            results.append(calls(http))
    ours, theirs = results

    # A thread that does not exist: LangGraph's server opens the stream (200) and waits;
    # toolfleet answers 404, as for another tenant's thread (the SDK opens it again once
    # its run.start has made the thread).
    assert (ours.pop("missing"), theirs.pop("missing")) == (404, 200)
    assert ours == theirs
    assert ours["unknown"] == (200, "error", "unknown_command")
    assert ours["started"] == (200, ["id", "meta", "result", "type"], 2)


def test_another_tenants_thread_is_not_found(pair: ApiPair) -> None:
    """Given a thread started through a command, another tenant's client neither reads
    its events (404) nor answers its interrupt; its own run.start on that id makes a
    thread of its own."""
    server = pair.toolfleet
    mine = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    theirs = {"Authorization": f"Bearer {OTHER_TENANT}"}
    thread = str(uuid.uuid4())
    commands = f"/threads/{thread}/commands"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        start = {"id": 1, "method": "run.start", "params": {"assistant_id": "approval"}}
        started = http.post(commands, json=start, headers=mine)
        assert started.json()["type"] == "success", started.text
        read = http.post(
            f"/threads/{thread}/stream/events", json={"channels": ["values"]}, headers=theirs
        )
        answer = http.post(
            commands,
            json={"id": 2, "method": "input.respond", "params": {"interrupt_id": "x"}},
            headers=theirs,
        )
        own = http.post(commands, json=start, headers=theirs)
        runs_mine = http.get(f"/threads/{thread}/runs", headers=mine).json()
        runs_theirs = http.get(f"/threads/{thread}/runs", headers=theirs).json()

    assert read.status_code == 404
    assert answer.json()["error"] == "no_such_run"
    assert own.json()["type"] == "success"
    assert [r["run_id"] for r in runs_mine] == [started.json()["result"]["run_id"]]
    assert [r["run_id"] for r in runs_theirs] == [own.json()["result"]["run_id"]]


def test_a_run_of_another_route_is_on_the_thread_stream(pair: ApiPair) -> None:
    """Given a thread whose resumable run was started by ``runs.create`` (not by a
    command), when its events are read through ``client.threads.stream``, then both
    servers show that run's lifecycle, values and interrupt, and the run a command's
    answer starts follows it on the same stream."""

    async def scenario(c: Any) -> dict[str, Any]:
        created = await c.threads.create()
        tid = created["thread_id"]
        # Resumable: LangGraph's server keeps only such a run's events for later readers.
        first = await c.runs.create(tid, "approval", input={"request": "a"}, stream_resumable=True)
        await c.runs.join(tid, first["run_id"])
        async with c.threads.stream(tid, assistant_id="approval") as thread:
            async with asyncio.timeout(30):
                while not thread.interrupts:
                    await asyncio.sleep(0.05)
            events = await until_terminal(thread.subscribe(["values", "lifecycle", "input"]))
            await thread.run.respond("no")
            output = await thread.output.with_timeout(60)
        return {
            "outline": outline(events),
            "output": output,
            "runs": [r["status"] for r in await c.runs.list(tid)],
        }

    ours, theirs = pair.both(scenario)

    assert ours["outline"] == theirs["outline"], (ours["outline"], theirs["outline"])
    assert ours["outline"][0] == ("lifecycle", (), "running")
    assert ours["outline"][-1] == ("input.requested", (), None)
    assert ours["output"] == theirs["output"] == {"request": "a", "answer": "no", "done": False}
    assert ours["runs"] == theirs["runs"] == ["success", "success"]


def test_a_finished_run_whose_log_expired_is_streamed_without_waiting(pair: ApiPair) -> None:
    """Given a finished run whose event log is gone (its retention passed), when the
    thread's events are read, then the run's lifecycle comes at once, ``running`` then
    ``completed``, not after a heartbeat's wait (toolfleet: LangGraph's server keeps no
    log of its own to expire)."""
    server = pair.toolfleet
    headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    thread = str(uuid.uuid4())
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        params = {"assistant_id": "fleet", "input": ask()}
        start = {"id": 1, "method": "run.start", "params": params}
        run_id = http.post(f"/threads/{thread}/commands", json=start).json()["result"]["run_id"]
        http.get(f"/threads/{thread}/runs/{run_id}/join")
        client = redis.Redis.from_url(server.settings.own_redis_url)
        try:
            assert client.delete(Keys(server.settings.key_prefix).events(run_id)) == 1
        finally:
            client.close()
        seen: list[str] = []
        started = time.monotonic()
        body = {"channels": ["lifecycle"]}
        with http.stream("POST", f"/threads/{thread}/stream/events", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:])["params"]["data"]["event"])
                    if len(seen) == 2:
                        break
        took = time.monotonic() - started

    assert seen == ["running", "completed"]
    assert took < 5, took


def test_a_failed_run_ends_its_stream_failed(pair: ApiPair) -> None:
    """Given a run started by a command with a message of an unknown role, when its
    events are read, then on both servers the stream ends with the root's ``failed``,
    its error naming the role, ``thread.output`` raises it, and the run is ``error``."""

    async def scenario(c: Any) -> dict[str, Any]:
        bad = {"messages": [{"role": "bogus-role", "content": "x"}]}
        async with c.threads.stream(assistant_id="fleet") as thread:
            await thread.run.start(input=bad)
            events = await until_terminal(thread.subscribe(["lifecycle"]))
            try:
                await thread.output.with_timeout(60)
                raised = "no error"
            except Exception as exc:
                raised = str(exc)
            runs = await c.runs.list(thread.thread_id)
        return {
            "outline": outline(events),
            "error": events[-1]["params"]["data"].get("error", ""),
            "raised": raised,
            "runs": [r["status"] for r in runs],
        }

    ours, theirs = pair.both(scenario)

    assert (
        ours["outline"]
        == theirs["outline"]
        == [
            ("lifecycle", (), "running"),
            ("lifecycle", (), "failed"),
        ]
    )
    for result in (ours, theirs):
        assert "bogus-role" in result["error"], result
        assert "bogus-role" in result["raised"], result
        assert result["runs"] == ["error"], result
