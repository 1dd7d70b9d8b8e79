"""``toolfleet serve`` and values its schema once admitted but could not store: 422, no trace.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own. Each
request here is refused with a 422 that names the field, and leaves no record behind:
the set of the service's Redis keys is the same after them as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis

from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(prefork_fleet, tmp_path_factory.mktemp("validation"), "validation")
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    token = server.settings.api_tokens[0]
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def server_keys(server: ServerProcess, redis_url: str) -> set[str]:
    r = redis.Redis.from_url(redis_url)
    try:
        pattern = f"{server.settings.key_prefix}server:*"
        return {k.decode() for k in r.scan_iter(pattern)} - {
            k.decode() for k in r.scan_iter(f"{server.settings.key_prefix}server:replica*")
        }
    finally:
        r.close()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def agent(**fields: Any) -> dict[str, Any]:
    return {"assistant_id": "agent", "input": {"messages": "hi"}, **fields}


BAD = [
    ("POST", "/threads", {"metadata": {"n": 2**70}}, "metadata"),
    ("POST", "/threads", {"metadata": nested(300)}, "metadata"),
    ("POST", "/threads", {"thread_id": "a\x07b"}, "thread_id"),
    ("POST", "/threads/search", {"offset": 2**70}, "offset"),
    ("POST", "/threads/search", {"metadata": {"n": -(2**64)}}, "metadata"),
    ("POST", "/runs/wait", agent(input={"messages": "hi", "n": 2**64}), "input"),
    ("POST", "/runs/wait", agent(metadata=nested(300)), "metadata"),
    ("POST", "/runs/wait", agent(config={"recursion_limit": 2**70}), "recursion_limit"),
    ("POST", "/runs", agent(after_seconds=1e300), "after_seconds"),
    ("POST", "/runs", agent(context={"deep": nested(300)}), "context"),
    (
        "POST",
        "/threads/ctl%0Ahere/runs/wait",
        agent(if_not_exists="create"),
        "thread_id",
    ),
    ("GET", "/threads/ctl%07here", None, "thread_id"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD)
def test_unstorable_values_are_422_naming_the_field_and_leave_nothing(
    server: ServerProcess,
    http: httpx.Client,
    redis_url: str,
    method: str,
    path: str,
    body: Any,
    field: str,
) -> None:
    before = server_keys(server, redis_url)
    response = http.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    assert server_keys(server, redis_url) == before


# JSON that names the wrong type: the documented type is the only one taken, never a
# coercion of another (false is not the integer 0, "5" is not 5, 1 is not true).
WRONG_TYPE = [
    ("/store/items/search", {"offset": False}, "offset"),
    ("/store/items/search", {"limit": "5"}, "limit"),
    ("/store/items/search", {"refresh_ttl": 1}, "refresh_ttl"),
    ("/store/namespaces", {"max_depth": True}, "max_depth"),
    ("/threads/search", {"limit": 5.0}, "limit"),
    ("/threads/search", {"offset": "0"}, "offset"),
    ("/assistants/search", {"limit": True}, "limit"),
    ("/runs", agent(stream_subgraphs="yes"), "stream_subgraphs"),
    ("/runs", agent(after_seconds="1"), "after_seconds"),
    ("/runs", agent(after_seconds=True), "after_seconds"),
    ("/runs/crons", {"assistant_id": "agent", "schedule": "* * * * *", "end_time": 1}, "end_time"),
]


@pytest.mark.parametrize(("path", "body", "field"), WRONG_TYPE)
def test_a_value_of_another_json_type_is_422_naming_the_field(
    server: ServerProcess, http: httpx.Client, redis_url: str, path: str, body: Any, field: str
) -> None:
    before = server_keys(server, redis_url)
    response = http.post(path, json=body)
    assert response.status_code == 422, response.text
    assert field in str(response.json()["detail"])
    assert server_keys(server, redis_url) == before


# A field the server does not know is refused, not dropped: a request is carried out as
# sent or not at all (a misspelt "metdata" or a newer client's option never vanishes).
UNKNOWN = [
    ("POST", "/threads", {"metdata": {"a": 1}}, "metdata"),
    ("POST", "/threads/search", {"limit": 1, "sortby": "created_at"}, "sortby"),
    ("POST", "/threads/count", {"where": {}}, "where"),
    ("PATCH", "/threads/{thread}", {"metadata": {}, "color": "red"}, "color"),
    ("POST", "/threads/{thread}/history", {"limit": 1, "page": 2}, "page"),
    ("POST", "/threads/{thread}/state", {"values": {}, "as_nodes": "x"}, "as_nodes"),
    ("POST", "/threads/{thread}/runs", agent(strict_resume=True), "strict_resume"),
    ("POST", "/runs/wait", agent(langsmith_tracer={"project_name": "p"}), "langsmith_tracer"),
    ("POST", "/runs/stream", agent(command={"resume": 1, "goto_node": "x"}), "goto_node"),
    ("POST", "/assistants", {"graph_id": "agent", "temperature": 0.2}, "temperature"),
    ("POST", "/assistants/search", {"graph": "agent"}, "graph"),
    ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {}, "tll": 5}, "tll"),
    ("POST", "/store/items/search", {"namespace": ["a"]}, "namespace"),
    ("POST", "/threads/prune", {"thread_ids": [], "dry_run": True}, "dry_run"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), UNKNOWN)
def test_an_unknown_field_is_422_naming_it_and_leaves_nothing(
    server: ServerProcess,
    http: httpx.Client,
    redis_url: str,
    method: str,
    path: str,
    body: Any,
    field: str,
) -> None:
    thread = http.post("/threads", json={}).json()["thread_id"]
    before = server_keys(server, redis_url)
    response = http.request(method, path.format(thread=thread), json=body)
    assert response.status_code == 422, response.text
    assert field in str(response.json()["detail"])
    assert server_keys(server, redis_url) == before


def test_history_filter_keys_must_be_plain_names(http: httpx.Client) -> None:
    """Given a thread, then a history filter key with a space is a 422 (the SQLite
    checkpointer would refuse it with a 500); a plain key filters."""
    tid = http.post("/threads", json={}).json()["thread_id"]
    http.post(f"/threads/{tid}/runs/wait", json=agent())
    bad = http.post(f"/threads/{tid}/history", json={"metadata": {"a b": 1}})
    assert bad.status_code == 422 and "metadata" in bad.json()["detail"]
    good = http.post(f"/threads/{tid}/history", json={"metadata": {"source": "loop"}})
    assert good.status_code == 200 and good.json()


def test_a_thread_id_no_header_can_carry_runs_once(http: httpx.Client) -> None:
    """Given a thread id outside latin-1, when a run is created on it, then the answer is
    a 200 whose Location is percent-encoded, and the thread has exactly that one run."""
    tid = "caf\u00e9-\u20ac-\u6f22"
    created = http.post(f"/threads/{tid}/runs", json=agent(if_not_exists="create"))
    assert created.status_code == 200, created.text
    assert created.headers["content-location"].startswith("/threads/caf%C3%A9-%E2%82%AC-")
    run_id = created.json()["run_id"]
    joined = http.get(f"/threads/{tid}/runs/{run_id}/join")
    assert joined.json()["messages"][-1]["content"] == "echo: hi"
    assert [r["run_id"] for r in http.get(f"/threads/{tid}/runs").json()] == [run_id]


def quote_path_param(value: str) -> str:
    """A path segment as langgraph-sdk makes it: every reserved character escaped."""
    quoted = quote(value, safe="")
    return "%2E" * len(quoted) if quoted and set(quoted) == {"."} else quoted


LONE_SURROGATE = b'"\\ud800"'
"""A JSON string escaping half of a surrogate pair: valid JSON, never encodable text."""


def raw(body: str) -> bytes:
    return body.encode().replace(b'"<S>"', LONE_SURROGATE)


UNENCODABLE = [
    ("POST", "/threads", '{"metadata": {"note": "<S>"}}', "metadata.note"),
    ("POST", "/threads", '{"metadata": {"<S>": 1}}', "metadata"),
    ("POST", "/threads", '{"thread_id": "<S>"}', "thread_id"),
    (
        "POST",
        "/runs/wait",
        '{"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "<S>"}]}}',
        "input.messages.0.content",
    ),
    ("POST", "/runs", '{"assistant_id": "agent", "config": {"tags": ["<S>"]}}', "tags"),
    ("POST", "/runs/batch", '[{"assistant_id": "agent", "metadata": {"m": "<S>"}}]', "metadata.m"),
    ("PUT", "/store/items", '{"namespace": ["n"], "key": "k", "value": {"v": "<S>"}}', "value.v"),
    ("PUT", "/store/items", '{"namespace": ["n"], "key": "<S>", "value": {}}', "key"),
    ("POST", "/assistants", '{"graph_id": "agent", "metadata": {"m": "<S>"}}', "metadata.m"),
    ("POST", "/assistants", '{"graph_id": "agent", "name": "<S>"}', "name"),
    ("POST", "/threads/search", '{"metadata": {"m": "<S>"}}', "metadata.m"),
    ("POST", "/runs/cancel", '{"thread_id": "<S>", "run_ids": []}', "thread_id"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), UNENCODABLE)
def test_a_lone_surrogate_is_422_naming_the_field_and_is_never_stored(
    server: ServerProcess,
    http: httpx.Client,
    redis_url: str,
    method: str,
    path: str,
    body: str,
    field: str,
) -> None:
    """Given a body whose JSON spells a lone surrogate (valid JSON, text no UTF-8 encoder
    writes), then the answer is a 422 naming where it is, nothing is stored, and the
    server goes on answering."""
    before = server_keys(server, redis_url)
    headers = {"Content-Type": "application/json"}
    response = http.request(method, path, content=raw(body), headers=headers)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]
    assert server_keys(server, redis_url) == before
    assert http.get("/store/items", params={"namespace": "n", "key": "k"}).json() is None
    assert http.post("/threads/count", json={}).status_code == 200


@pytest.mark.parametrize("thread_id", ["a/b", "/", "tenant/../x", ".", ".."])
def test_a_thread_id_that_cannot_be_one_path_segment_is_refused_at_creation(
    server: ServerProcess, http: httpx.Client, redis_url: str, thread_id: str
) -> None:
    """Given an id holding ``/`` (the server decodes ``%2F`` before routing, so no URL
    could name the thread again) or a dot-segment (clients drop it), then creating a
    thread or an assistant of that id is a 422 naming the field, and nothing is stored."""
    before = server_keys(server, redis_url)
    created = http.post("/threads", json={"thread_id": thread_id})
    assert created.status_code == 422, created.text
    assert "thread_id" in created.json()["detail"]
    assistant = http.post("/assistants", json={"graph_id": "agent", "assistant_id": thread_id})
    assert assistant.status_code == 422, assistant.text
    assert "assistant_id" in assistant.json()["detail"]
    assert server_keys(server, redis_url) == before


def test_a_dot_segment_in_the_path_does_not_create_a_thread(
    server: ServerProcess, http: httpx.Client, redis_url: str
) -> None:
    """Given ``..`` percent-encoded as a path's thread id (it reaches the route decoded),
    then a run that would create the thread is a 422, and nothing is stored."""
    before = server_keys(server, redis_url)
    response = http.post("/threads/%2E%2E/runs", json=agent(if_not_exists="create"))
    assert response.status_code == 422, response.text
    assert "thread_id" in response.json()["detail"]
    assert server_keys(server, redis_url) == before


@pytest.mark.parametrize("thread_id", ["a?b#c", "50%off", "back\\slash", "sp ace+;=&~", "x.y", "é"])
def test_other_awkward_thread_ids_round_trip_through_the_path(
    http: httpx.Client, thread_id: str
) -> None:
    """Given a thread whose id has characters reserved in URLs (but no ``/``), then the
    SDK's encoding of it reads and deletes that very thread."""
    created = http.post("/threads", json={"thread_id": thread_id, "metadata": {"k": 1}})
    assert created.status_code == 200, created.text
    segment = quote_path_param(thread_id)
    got = http.get(f"/threads/{segment}")
    assert got.status_code == 200 and got.json()["thread_id"] == thread_id
    assert http.delete(f"/threads/{segment}").status_code == 204
    assert http.get(f"/threads/{segment}").status_code == 404


@pytest.mark.parametrize("number", [2**63, 2**64 - 1, -(2**63) - 1, 2**80])
def test_a_history_filter_number_a_checkpointer_cannot_compare_is_422(
    http: httpx.Client, number: int
) -> None:
    """Given a thread, then a history filter value beyond the signed 64-bit integers
    (SQLite's) is a 422 naming the field and the range (before: SQLite's overflow, a
    500); the largest one it can compare filters."""
    tid = http.post("/threads", json={}).json()["thread_id"]
    bad = http.post(f"/threads/{tid}/history", json={"metadata": {"step": number}})
    assert bad.status_code == 422, bad.text
    assert "metadata" in bad.text and "64-bit" in bad.text
    assert "Traceback" not in bad.text
    edge = http.post(f"/threads/{tid}/history", json={"metadata": {"step": 2**63 - 1}})
    assert edge.status_code == 200 and edge.json() == []


@pytest.mark.parametrize("token", ["²", "٣", "9" * 5_000, "-1", " 1", 7, ""])
def test_a_malformed_a2a_page_token_is_invalid_params_with_no_traceback(
    http: httpx.Client, token: object
) -> None:
    """Given an assistant, then ``ListTasks`` with a page token that is not an offset
    it gave (a superscript or Arabic-Indic digit, 5,000 digits, a sign, a space, a
    number) is answered -32602 "Invalid pageToken" (before: an internal error), and no
    answer holds a traceback; an empty token is the first page."""
    assistant = http.post("/assistants", json={"graph_id": "agent"}).json()["assistant_id"]
    call = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageToken": token}}
    answer = http.post(f"/a2a/{assistant}", json=call, headers={"Accept": "application/json"})
    assert "Traceback" not in answer.text and 'File "' not in answer.text
    if token == "":
        assert answer.json()["result"]["tasks"] == [], answer.text
        return
    error = answer.json()["error"]
    assert (error["code"], error["message"]) == (-32602, "Invalid pageToken."), answer.text
