"""The HTTP service's pure parts: encodings, auth, request schemas, config, model choice."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.types import Interrupt, StateSnapshot
from langgraph_sdk.sse import SSEDecoder
from pydantic import ValidationError

from orchestrator.scripted import ScriptedChatModel
from orchestrator.server import create_app
from orchestrator.server.auth import TokenAuth
from orchestrator.server.encoding import dumps, loads, sse_frame, thread_state
from orchestrator.server.eventlog import parse_id
from orchestrator.server.graph import ASSISTANT_ID, SCRIPTED, resolve_model
from orchestrator.server.keys import Keys
from orchestrator.server.records import RunRecord
from orchestrator.server.runconfig import run_config
from orchestrator.server.runstream import recorded_modes
from orchestrator.server.schemas import HistoryRequest, RunCreate
from orchestrator.server.streaming import event_filter
from tests import server_models
from tests.support.fleet import REPO
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import Settings

TOKEN = "unit-token"


def decode_sse(raw: bytes) -> list[tuple[str, object, str | None]]:
    """Parse a response body the way langgraph-sdk does."""
    decoder = SSEDecoder()
    parts = []
    for line in raw.split(b"\n"):
        part = decoder.decode(line)
        if part is not None:
            parts.append((part.event, part.data, part.id))
    return parts


def test_given_messages_and_interrupts_when_encoded_then_clients_read_them() -> None:
    value = {
        "messages": [HumanMessage("hi", id="h1"), AIMessage("yo", id="a1")],
        "__interrupt__": [Interrupt(value={"ask": "ok?"}, id="i1")],
        "tags": {"x"},
        "odd": object(),
    }
    decoded = loads(dumps(value))
    assert decoded["messages"][0]["type"] == "human" and decoded["messages"][0]["content"] == "hi"
    assert decoded["messages"][1]["type"] == "ai" and decoded["messages"][1]["id"] == "a1"
    assert decoded["__interrupt__"][0]["value"] == {"ask": "ok?"}
    assert decoded["tags"] == ["x"]
    assert decoded["odd"].startswith("<object object")


def test_given_a_frame_when_the_sdk_decoder_reads_it_then_event_data_and_id_survive() -> None:
    body = sse_frame("custom", dumps({"toolfleet": {"event": "started", "text": "a\nb"}}), "5-1")
    body += sse_frame("metadata", dumps({"run_id": "r"}))

    parts = decode_sse(body)

    assert parts[0] == ("custom", {"toolfleet": {"event": "started", "text": "a\nb"}}, "5-1")
    assert parts[1][:2] == ("metadata", {"run_id": "r"})


def test_given_a_snapshot_then_thread_state_has_the_protocol_fields() -> None:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c2"}}
    parent = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    snapshot = StateSnapshot(
        values={"messages": []},
        next=("tools",),
        config=config,
        metadata={"step": 2},
        created_at="2026-01-01T00:00:00+00:00",
        parent_config=parent,
        tasks=(),
        interrupts=(),
    )

    state = loads(dumps(thread_state(snapshot)))

    assert state["next"] == ["tools"]
    assert state["checkpoint"]["checkpoint_id"] == "c2"
    assert state["parent_checkpoint"]["checkpoint_id"] == "c1"
    assert set(state) == {
        "values",
        "next",
        "checkpoint",
        "metadata",
        "created_at",
        "parent_checkpoint",
        "tasks",
        "interrupts",
        "checkpoint_id",
        "parent_checkpoint_id",
    }
    assert (state["checkpoint_id"], state["parent_checkpoint_id"]) == ("c2", "c1")


def test_given_a_thread_without_checkpoints_then_its_state_has_a_null_checkpoint() -> None:
    """LangGraph's server answers ``checkpoint: null`` there (UI code checks it)."""
    empty = StateSnapshot(
        values={},
        next=(),
        config={"configurable": {"thread_id": "t"}},
        metadata=None,
        created_at=None,
        parent_config=None,
        tasks=(),
        interrupts=(),
    )

    state = thread_state(empty, "t")

    assert state["checkpoint"] is None and state["parent_checkpoint"] is None
    assert state["checkpoint_id"] is None


def test_given_tokens_then_only_those_are_accepted() -> None:
    auth = TokenAuth(["one", "two"])
    assert auth.enabled and auth.accepts("two")
    assert not auth.accepts("three") and not auth.accepts(None) and not auth.accepts("")
    assert not TokenAuth([]).enabled


def test_given_the_app_then_requests_need_a_token_and_bad_bodies_name_the_field() -> None:
    app = create_app(Settings(api_tokens=(TOKEN,)))
    app.state.services = None  # no lifespan: only what runs before the handlers is reached
    app.state.auth.bind(b"unit-key")  # what the lifespan does with the deployment's key
    http = TestClient(app)

    assert http.get("/ok").json() == {
        "ok": True,
        "services": {"redis": "skipped", "database": "skipped"},
    }
    unauthorized = http.post("/threads/t/runs", json={})
    assert unauthorized.status_code == 401
    assert unauthorized.headers["www-authenticate"] == "Bearer"
    assert TOKEN not in unauthorized.text
    for headers in ({"Authorization": f"Bearer {TOKEN}"}, {"X-Api-Key": TOKEN}):
        invalid = http.post("/threads/t/runs", json={"stream_mode": 3}, headers=headers)
        assert invalid.status_code == 422
        assert "assistant_id: Field required" in invalid.json()["detail"]
        assert "stream_mode" in invalid.json()["detail"]
    assert "/threads/{thread_id}/runs/{run_id}/join" in http.get("/openapi.json").json()["paths"]


def test_given_history_before_in_each_clients_form_then_it_names_the_checkpoint() -> None:
    forms = [
        "c7",  # the query-string form
        {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c7"},  # Python SDK
        {"configurable": {"thread_id": "t", "checkpoint_id": "c7"}},  # JS SDK
    ]
    for before in forms:
        parsed = HistoryRequest.model_validate({"limit": 3, "before": before}).before
        assert (parsed if isinstance(parsed, str) else parsed.checkpoint_id) == "c7"


def test_given_run_bodies_then_defaults_and_refusals_follow_the_protocol() -> None:
    body = RunCreate.model_validate({"assistant_id": "agent", "stream_mode": "updates"})
    assert body.stream_mode == ["updates"]
    assert body.multitask_strategy == "enqueue" and body.on_disconnect == "continue"
    with pytest.raises(ValidationError) as unknown:
        RunCreate.model_validate({"assistant_id": "agent", "unknown": 1, "langsmith_tracer": {}})
    assert {e["loc"][-1] for e in unknown.value.errors()} == {"unknown", "langsmith_tracer"}
    assert {e["type"] for e in unknown.value.errors()} == {"extra_forbidden"}
    # A config is a RunnableConfig, open as LangGraph's: keys beyond these are dropped.
    config = {"configurable": {"x": 1}, "metadata": {"from": "RemoteGraph"}, "run_name": "r"}
    assert RunCreate.model_validate({"assistant_id": "agent", "config": config}).config
    for bad in ({"stream_mode": ["sideways"]}, {"multitask_strategy": "later"}):
        with pytest.raises(ValidationError) as caught:
            RunCreate.model_validate({"assistant_id": "agent", **bad})
        assert next(iter(bad)) in str(caught.value)


def test_given_stream_modes_then_custom_is_recorded_and_messages_tuple_is_messages() -> None:
    assert recorded_modes(["values", "values"]) == ["values", "custom"]
    assert recorded_modes(["custom", "updates"]) == ["custom", "updates"]
    assert event_filter(["messages-tuple", "custom"]) == frozenset({"messages", "custom"})
    assert event_filter(None) is None and event_filter([""]) is None


def test_given_a_run_then_its_config_carries_thread_and_run_identity() -> None:
    run_id = str(uuid.uuid4())
    run = RunRecord(
        run_id, "t1", ASSISTANT_ID, "now", "now", "pending", "r1", {"who": "me"}, tenant="ta"
    )
    body = RunCreate.model_validate(
        {
            "assistant_id": "agent",
            "config": {"configurable": {"thread_id": "spoofed", "x": 1}, "recursion_limit": 7},
            "checkpoint_id": "c9",
        }
    )

    config = run_config(run, body, "agent")

    # The graph's thread is the tenant's: another tenant's "t1" is another thread.
    assert config["configurable"]["thread_id"] == "ta/t1" and config["configurable"]["x"] == 1
    assert config["metadata"]["thread_id"] == "t1"
    assert config["configurable"]["checkpoint_id"] == "c9"
    assert config["run_id"] == uuid.UUID(run_id) and config["recursion_limit"] == 7
    assert config["metadata"]["who"] == "me" and config["metadata"]["run_id"] == run_id
    assert config["configurable"]["graph_id"] == "agent"
    assert config["configurable"]["assistant_id"] == ASSISTANT_ID


def test_given_model_specs_then_the_right_model_is_built() -> None:
    assert isinstance(resolve_model(None), ScriptedChatModel)
    assert isinstance(resolve_model(SCRIPTED), ScriptedChatModel)
    assert isinstance(resolve_model("tests.server_models:directed"), server_models.DirectedModel)
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_model("tests.server_models:nothing_here")
    with pytest.raises(ConfigError, match="not a chat model"):
        resolve_model("tests.server_models:json")


def test_given_a_module_without_a_package_then_the_model_is_imported_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``module:attribute`` with a plain module of the working directory imports it,
    whatever the import path started as; a spec that is neither fails clearly."""
    name = f"models_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from tests.server_models import directed\n\nfast = directed\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])

    assert isinstance(resolve_model(f"{name}:fast"), server_models.DirectedModel)
    with pytest.raises(ConfigError, match=r"not module:attribute .* init_chat_model"):
        resolve_model(f"{name}:missing")
    with pytest.raises(ConfigError, match="current directory"):
        resolve_model("nosuchmodule_tf:thing")


def test_given_stream_entry_ids_then_they_order_numerically() -> None:
    assert parse_id("0") == (0, 0) < parse_id("9-1") < parse_id("10-0") < parse_id("10-2")
    for bad in ("not-an-id", "5_000", "\u0663-0", "99999999999999999999-0", "1-", " 1-0"):
        with pytest.raises(ValueError):
            parse_id(bad)
    assert parse_id("18446744073709551615-0") == (2**64 - 1, 0)


def test_given_a_run_record_then_its_api_form_is_a_protocol_run() -> None:
    run = RunRecord("r", "t", ASSISTANT_ID, "a", "b", "success", "rep")
    api = run.to_api()
    assert {"run_id", "thread_id", "assistant_id", "status", "multitask_strategy"} <= set(api)
    assert dataclasses.replace(run, status="pending").done is False and run.done is True


def test_given_ids_that_look_like_keys_then_no_two_keys_collide() -> None:
    keys = Keys("ns:toolfleet:")
    ids = ["x", "x:runs", "runs:x", "x:events", "x:alive", "lock:x"]
    names = [
        key
        for i in ids
        for key in (
            keys.thread(i),
            keys.thread_runs(i),
            keys.thread_lock(i),
            keys.thread_queue(i),
            keys.run(i),
            keys.run_alive(i),
            keys.events(i),
            keys.replica(i),
            keys.wake(i),
        )
    ]
    assert len(names) == len(set(names))


def test_given_no_tokens_when_serve_starts_then_it_refuses_unless_told_no_auth() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--port", "1"],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no API tokens" in done.stderr and "--no-auth" in done.stderr


def test_given_a_bad_project_file_when_serve_starts_then_it_says_so_and_exits() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--config", "no-such/langgraph.json"],
        env={**env, "PYTHONPATH": str(REPO), "TOOLFLEET_API_TOKENS": "t"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "langgraph.json: cannot read it" in done.stderr


def test_assistant_search_sorts_by_the_field_and_order_asked_for() -> None:
    """Given three assistants, when searched with each sort, then they come in that
    field's order (names ignoring case), ties in the project's order, newest first by
    default."""
    from types import SimpleNamespace

    from orchestrator.server.routes.assistants import search_assistants
    from orchestrator.server.schemas import AssistantSearch

    def assistant(graph_id: str, name: str, created_at: str) -> dict[str, Any]:
        return {
            "assistant_id": f"id-{graph_id}",
            "graph_id": graph_id,
            "name": name,
            "metadata": {},
            "created_at": created_at,
            "updated_at": created_at,
        }

    found = [
        assistant("b", "beta", "2026-01-01T00:00:00+00:00"),
        assistant("a", "Alpha", "2026-01-02T00:00:00+00:00"),
        assistant("c", "gamma", "2026-01-01T00:00:00+00:00"),
    ]

    async def every(tenant: str) -> list[dict[str, Any]]:
        return list(found)

    svc = SimpleNamespace(assistants=SimpleNamespace(all=every))

    def order(**sort: Any) -> list[str]:
        search = search_assistants(svc, "tenant", AssistantSearch(**sort))  # type: ignore[arg-type]
        answer = json.loads(bytes(asyncio.run(search).body))
        return [a["graph_id"] for a in answer]

    assert order() == ["a", "b", "c"]
    assert order(sort_by="created_at", sort_order="asc") == ["b", "c", "a"]
    assert order(sort_by="name", sort_order="asc") == ["a", "b", "c"]
    assert order(sort_by="name") == ["c", "b", "a"]
    assert order(sort_by="graph_id", sort_order="asc", limit=2, offset=1) == ["b", "c"]
