"""A2A, with the ``a2a-sdk`` client, against ``toolfleet serve`` and ``langgraph dev``:
an assistant's agent card, ``message/send`` on a new context and a follow-up in it,
``message/stream``, ``tasks/get``, ``tasks/cancel`` and JSON-RPC refusals. What the
client observes is compared; the runs A2A starts show in the thread's runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import Message, Part, Role, Task, TaskIdParams, TaskQueryParams, TextPart

from tests.support.api_pair import ApiPair, api_pair
from tests.support.fleet import REPO
from tests.support.serving import ServerProcess, prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    tokens = (f"tft-a2a-{uuid.uuid4().hex}", f"tft-a2a-other-{uuid.uuid4().hex}")
    yield from api_pair(prefork_fleet, tmp_path_factory, tokens)


def _headers(pair: ApiPair, server: ServerProcess) -> dict[str, str]:
    if server is pair.toolfleet:
        return {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    return {}


def _text(text: str, context_id: str | None = None, task_id: str | None = None) -> Message:
    return Message(
        role=Role.user,
        parts=[Part(root=TextPart(text=text))],
        message_id=str(uuid.uuid4()),
        context_id=context_id,
        task_id=task_id,
    )


async def _fleet_assistant(http: httpx.AsyncClient) -> str:
    """The server's own assistant of the fleet graph (every tenant's)."""
    query = {"graph_id": "fleet", "metadata": {"created_by": "system"}}
    found = await http.post("/assistants/search", json=query)
    found.raise_for_status()
    return str(found.json()[0]["assistant_id"])


def _texts(parts: Any) -> list[str]:
    return [p.root.text for p in parts or [] if getattr(p.root, "kind", "") == "text"]


async def _scenario(pair: ApiPair, server: ServerProcess) -> dict[str, Any]:
    headers = _headers(pair, server)
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
        assistant = await _fleet_assistant(http)
        card = await A2ACardResolver(http, server.url).get_agent_card(
            relative_card_path=f"/.well-known/agent-card.json?assistant_id={assistant}"
        )
        seen: dict[str, Any] = {
            "card": {
                "name": card.name,
                "url": card.url,
                "streaming": card.capabilities.streaming,
                "push": card.capabilities.push_notifications,
                "input_modes": card.default_input_modes,
                "output_modes": card.default_output_modes,
                "skills": [(s.id, s.input_modes) for s in card.skills],
            }
        }
        sender = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        events = [e async for e in sender.send_message(_text("hello"))]
        task = events[-1][0]
        assert isinstance(task, Task)
        seen["send"] = {
            "events": len(events),
            "state": task.status.state.value,
            "artifact": [_texts(a.parts) for a in task.artifacts or []],
            "history": [(m.role.value, _texts(m.parts)) for m in task.history or []],
            "task_id_is_context_and_run": task.id.startswith(f"{task.context_id}:"),
        }
        again = [e async for e in sender.send_message(_text("again", context_id=task.context_id))][
            -1
        ][0]
        seen["follow_up"] = {
            "same_context": again.context_id == task.context_id,
            "new_task": again.id != task.id,
            "state": again.status.state.value,
            "history": [(m.role.value, _texts(m.parts)) for m in again.history or []],
        }
        got = await sender.get_task(TaskQueryParams(id=task.id))
        seen["get"] = {"state": got.status.state.value, "id": got.id == task.id}
        thread_runs = (await http.get(f"/threads/{task.context_id}/runs")).json()
        seen["runs_on_thread"] = sorted(r["status"] for r in thread_runs)

        streamer = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        streamed = [e async for e in streamer.send_message(_text("streamed"))]
        kinds = []
        for streamed_task, update in streamed:
            kinds.append(
                ("task", streamed_task.status.state.value)
                if update is None
                else (update.kind, getattr(getattr(update, "status", None), "state", None))
            )
        final_task = streamed[-1][0]
        seen["stream"] = {
            "kinds": [(k, s.value if hasattr(s, "value") else s) for k, s in kinds],
            "final_state": final_task.status.state.value,
            "artifact": [_texts(a.parts) for a in final_task.artifacts or []],
        }

        try:
            await sender.cancel_task(TaskIdParams(id=task.id))
            seen["cancel_done"] = "cancelled"
        except A2AClientJSONRPCError as exc:
            seen["cancel_done"] = exc.error.code
        try:
            await sender.get_task(TaskQueryParams(id=f"{task.context_id}:{uuid.uuid4()}"))
            seen["get_unknown"] = "found"
        except A2AClientJSONRPCError as exc:
            seen["get_unknown"] = exc.error.code

        slow = json.dumps({"calls": [["sleep_for", {"seconds": 20}]]})
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/stream",
            "params": {"message": _text(slow).model_dump(mode="json", exclude_none=True)},
        }
        running_task = None
        async with http.stream(
            "POST", f"/a2a/{assistant}", json=body, headers={"Accept": "text/event-stream"}
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    result = json.loads(line[5:])["result"]
                    running_task = result["id"]
                    break
        assert running_task is not None
        context = running_task.split(":")[0]
        for _ in range(100):
            runs = (await http.get(f"/threads/{context}/runs")).json()
            if runs and runs[0]["status"] == "running":
                break
            await asyncio.sleep(0.1)
        cancelled = await sender.cancel_task(TaskIdParams(id=running_task))
        seen["cancel_running"] = cancelled.status.state.value
        after = await sender.get_task(TaskQueryParams(id=running_task))
        seen["after_cancel"] = after.status.state.value

        seen["rpc"] = [
            await _rpc(http, assistant, b"{not json"),
            await _rpc(http, assistant, {"jsonrpc": "1.0", "id": 1, "method": "tasks/get"}),
            await _rpc(http, assistant, {"jsonrpc": "2.0", "id": 2, "method": "no/such"}),
            await _rpc(http, assistant, {"jsonrpc": "2.0", "id": 3, "method": "message/send"}),
            await _rpc(
                http, "not-a-uuid", {"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {}}
            ),
            await _rpc(
                http,
                str(uuid.uuid4()),
                {
                    "jsonrpc": "2.0",
                    "id": 5,
                    "method": "message/send",
                    "params": {"message": _text("x").model_dump(mode="json", exclude_none=True)},
                },
            ),
        ]

        async def list_tasks(params: dict[str, Any]) -> Any:
            body = {"jsonrpc": "2.0", "id": 7, "method": "ListTasks", "params": params}
            answer = await http.post(
                f"/a2a/{assistant}", json=body, headers={"Accept": "application/json"}
            )
            value = answer.json()
            if "error" in value:
                return value["error"]["code"]
            listed = value["result"]
            return [
                [
                    (
                        t["id"] in (task.id, again.id),
                        t["contextId"] == task.context_id,
                        t["status"]["state"],
                        t.get("artifacts"),
                        [m["role"] for m in t.get("history", [])],
                    )
                    for t in listed["tasks"]
                ],
                listed["totalSize"],
                listed["pageSize"],
                listed["nextPageToken"],
            ]

        seen["list"] = [
            await list_tasks({"contextId": task.context_id}),
            await list_tasks({"contextId": task.context_id, "pageSize": 1, "historyLength": 0}),
            await list_tasks({"contextId": task.context_id, "status": "TASK_STATE_FAILED"}),
            await list_tasks({"pageSize": 0}),
            await list_tasks({"contextId": str(uuid.uuid4())}),
        ]
        v1 = _text("new names").model_dump(mode="json", exclude_none=True)
        v1 = {**v1, "role": "ROLE_USER"}
        answer = await http.post(
            f"/a2a/{assistant}",
            json={"jsonrpc": "2.0", "id": 6, "method": "SendMessage", "params": {"message": v1}},
            headers={"Accept": "application/json"},
        )
        v1_task = answer.json()["result"]["task"]
        seen["v1_names"] = [
            v1_task["status"]["state"],
            [m["role"] for m in v1_task["history"]][-2:],
            v1_task["artifacts"][0]["parts"],
        ]
        cards = []
        for a2a in ({"input_modes": ["text/plain"]}, {"output_modes": []}):
            made = await http.post(
                "/assistants", json={"graph_id": "fleet", "metadata": {"a2a": a2a}}
            )
            made_id = made.json()["assistant_id"]
            answer = await http.get(f"/.well-known/agent-card.json?assistant_id={made_id}")
            value = answer.json()
            cards.append((answer.status_code, value.get("defaultInputModes"), value.get("error")))
        seen["card_modes"] = cards
        missing = await http.get("/.well-known/agent-card.json")
        seen["card_without_assistant"] = missing.status_code
        seen["card_by_path"] = (
            await http.get(f"/a2a/{assistant}/.well-known/agent-card.json")
        ).json()["name"] == card.name
        return seen


async def _rpc(http: httpx.AsyncClient, assistant: str, body: Any) -> tuple[int, Any]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = await http.post(
        f"/a2a/{assistant}",
        content=content,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    value = answer.json()
    return answer.status_code, (value.get("error") or {}).get("code")


def test_a2a_against_both_servers(pair: ApiPair) -> None:
    """Given the fleet agent on both servers, when an A2A client reads its card, sends a
    message, follows up in the same context, streams one, reads and cancels tasks and
    sends malformed JSON-RPC, then it observes the same on both: the card's fields, a
    completed task whose artifact is the agent's answer and whose history is the
    context's turns, the stream's event kinds and final state, the error codes."""
    ours = run(_scenario(pair, pair.toolfleet))
    theirs = run(_scenario(pair, pair.langgraph))

    for key in ("url",):
        assert ours["card"].pop(key).endswith("/a2a/" + ours["card"]["skills"][0][0][:-5])
        theirs["card"].pop(key)
    # No assistant named: 422 naming the parameter here, 400 there; no such assistant:
    # 404 here, as on every route of toolfleet (the A2A client fails alike on both).
    assert (ours.pop("card_without_assistant"), theirs.pop("card_without_assistant")) == (
        422,
        400,
    )
    assert ours["list"] == theirs["list"]
    assert ours == theirs
    assert ours["send"]["state"] == "completed"
    assert ours["send"]["artifact"] == [["echo: hello"]]
    assert ours["follow_up"]["history"][-2:] == [("user", ["again"]), ("agent", ["echo: again"])]
    assert ours["stream"]["final_state"] == "completed"
    assert ours["cancel_running"] == "canceled"
    assert ours["card_modes"][0] == (200, ["text/plain"], None)
    assert ours["card_modes"][1][0] == 400
    assert ours["list"][0][1:] == [2, 2, ""]
    assert ours["list"][1][1:] == [2, 1, "1"]
    assert ours["list"][2:] == [[[], 0, 0, ""], -32602, [[], 0, 0, ""]]
    assert ours["v1_names"] == [
        "TASK_STATE_COMPLETED",
        ["ROLE_USER", "ROLE_AGENT"],
        [{"kind": "text", "text": "echo: new names"}],
    ]


def test_a2a_is_the_tenants_alone(pair: ApiPair) -> None:
    """Given toolfleet with two tenants, then A2A needs a token (401 without); a tenant
    cannot read another's assistant's card, nor get or cancel its task, and a message
    naming the other's context runs on a thread of its own, not on the other's."""
    server = pair.toolfleet
    mine, theirs = (
        {"Authorization": f"Bearer {token}"} for token in server.settings.api_tokens[:2]
    )

    def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}

    async def scenario() -> list[Any]:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as anonymous,
            httpx.AsyncClient(base_url=server.url, headers=mine, timeout=60) as a,
            httpx.AsyncClient(base_url=server.url, headers=theirs, timeout=60) as b,
        ):
            fleet = await _fleet_assistant(a)
            own = (await a.post("/assistants", json={"graph_id": "fleet"})).json()["assistant_id"]
            card = f"/.well-known/agent-card.json?assistant_id={own}"
            message = _text("hello").model_dump(mode="json", exclude_none=True)
            sent = await a.post(f"/a2a/{fleet}", json=call("message/send", {"message": message}))
            task = sent.json()["result"]
            context = task["contextId"]
            intruding = {**message, "contextId": context, "messageId": str(uuid.uuid4())}
            b_sent = await b.post(
                f"/a2a/{fleet}", json=call("message/send", {"message": intruding})
            )
            return [
                (await anonymous.get(card)).status_code,
                (await anonymous.post(f"/a2a/{fleet}", json=call("tasks/get", {}))).status_code,
                (await a.get(card)).status_code,
                (await b.get(card)).status_code,
                (await b.post(f"/a2a/{fleet}", json=call("tasks/get", {"id": task["id"]}))).json()[
                    "error"
                ]["code"],
                (
                    await b.post(f"/a2a/{fleet}", json=call("tasks/cancel", {"id": task["id"]}))
                ).json()["error"]["code"],
                b_sent.json()["result"]["status"]["state"],
                len((await a.get(f"/threads/{context}/runs")).json()),
                len((await b.get(f"/threads/{context}/runs")).json()),
            ]

    assert run(scenario()) == [401, 401, 200, 404, -32001, -32001, "completed", 1, 1]


ASKER = REPO / "tests" / "a2a_project" / "langgraph.json"
"""A project whose one graph asks a question (an interrupt), then greets the answer."""


@pytest.fixture(scope="module")
def asker_pair(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiPair]:
    yield from api_pair(
        prefork_fleet, tmp_path_factory, (f"tft-asker-{uuid.uuid4().hex}",), project=ASKER
    )


def test_a2a_task_that_needs_input(asker_pair: ApiPair) -> None:
    """Given a graph that asks a question, when an A2A client sends a message, then the
    task needs input (its artifact the question) and the answer sent to the task resumes
    it to completion with the greeting, a resume of the done task refused; a second such
    task, cancelled while it waits, is canceled and takes no answer, on both servers."""

    async def scenario(server: ServerProcess) -> list[Any]:
        headers = _headers(asker_pair, server)
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as http:
            found = await http.post("/assistants/search", json={"graph_id": "asker"})
            assistant = found.json()[0]["assistant_id"]
            card = await A2ACardResolver(http, server.url).get_agent_card(
                relative_card_path=f"/.well-known/agent-card.json?assistant_id={assistant}"
            )
            client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)

            async def send(message: Message) -> Any:
                try:
                    return [e async for e in client.send_message(message)][-1][0]
                except A2AClientJSONRPCError as exc:
                    return exc.error.code

            asked = await send(_text("hi"))
            waiting = await client.get_task(TaskQueryParams(id=asked.id))
            done = await send(_text("Ada", context_id=asked.context_id, task_id=asked.id))
            resume_done = {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "message/send",
                "params": {
                    "message": {
                        **_text("x", asked.context_id, done.id).model_dump(
                            mode="json", exclude_none=True
                        ),
                        "parts": [{"kind": "data", "data": {"resume": "again"}}],
                    }
                },
            }
            refused = await http.post(
                f"/a2a/{assistant}", json=resume_done, headers={"Accept": "application/json"}
            )
            second = await send(_text("hi"))
            cancelled = await client.cancel_task(TaskIdParams(id=second.id))
            after = await client.get_task(TaskQueryParams(id=second.id))
            late = await send(_text("Bob", context_id=second.context_id, task_id=second.id))
            state = (await http.get(f"/threads/{second.context_id}")).json()["status"]
            return [
                asked.status.state.value,
                [
                    [p.root.model_dump(mode="json", exclude_none=True) for p in a.parts]
                    for a in asked.artifacts or []
                ],
                waiting.status.state.value,
                done.id == asked.id,
                done.status.state.value,
                [_texts(a.parts) for a in done.artifacts or []],
                refused.json()["error"]["code"],
                cancelled.status.state.value,
                after.status.state.value,
                late,
                state,
            ]

    ours = run(scenario(asker_pair.toolfleet))
    theirs = run(scenario(asker_pair.langgraph))

    for answer in (ours, theirs):  # interrupt ids are the server's own
        for artifact in answer[1]:
            for part in artifact:
                part["data"].pop("id", None)
    assert ours == theirs
    assert ours[0] == ours[2] == "input-required"
    assert ours[1] == [[{"kind": "data", "data": {"value": "What is your name?"}}]]
    assert ours[4:] == [
        "completed",
        [["hello Ada"]],
        -32004,
        "canceled",
        "canceled",
        -32004,
        "idle",
    ]


def test_a2a_refuses_what_no_thread_takes(pair: ApiPair) -> None:
    """Given toolfleet, when a message names a context no thread id can be (too long, a
    path of segments, control characters) or a body nests past the parser's depth, then
    JSON-RPC errors answer (-32602, -32700) and no thread is made."""
    server = pair.toolfleet
    headers = {**_headers(pair, server), "Accept": "application/json"}

    async def scenario() -> list[Any]:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            assistant = await _fleet_assistant(http)
            codes = []
            for context in ("x" * 300, "a/b", "bad\x01id"):
                message = _text("hi").model_dump(mode="json", exclude_none=True)
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "message/send",
                    "params": {"message": {**message, "contextId": context}},
                }
                answer = await http.post(f"/a2a/{assistant}", json=body)
                codes.append(answer.json()["error"]["code"])
            deep = b"[" * 100_000 + b"]" * 100_000
            answer = await http.post(
                f"/a2a/{assistant}", content=deep, headers={"Content-Type": "application/json"}
            )
            codes.append(answer.json()["error"]["code"])
            codes.append(len((await http.post("/threads/search", json={})).json()))
            return codes

    before = run(scenario())[-1]
    assert run(scenario()) == [-32602, -32602, -32602, -32700, before]
