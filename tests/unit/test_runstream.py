"""A run's graph output as the protocol's stream events (orchestrator/server/runstream.py)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk

from orchestrator.server.runstream import RunStream
from orchestrator.server.schemas import RunCreate


def stream(*modes: str) -> RunStream:
    return RunStream(RunCreate(assistant_id="agent", stream_mode=list(modes)), "t1")


def parts(run: RunStream, *items: Any) -> list[tuple[str, Any]]:
    return [event for item in items for event in run._part(item)]


def test_given_messages_then_the_older_form_sends_metadata_once_and_the_message_so_far() -> None:
    run = stream("messages")
    meta = {"langgraph_node": "model"}
    chunks = [AIMessageChunk(content=w, id="m1") for w in ("done: ", "2 ", "results")]

    events = parts(run, *(("messages", (c, meta)) for c in chunks))

    assert [e for e, _ in events] == ["messages/metadata"] + ["messages/partial"] * 3
    assert events[0][1] == {"m1": {"metadata": meta}}
    last = events[-1][1][0]
    assert isinstance(last, AIMessage) and not isinstance(last, AIMessageChunk)
    assert last.content == "done: 2 results"


def test_given_a_whole_message_then_the_older_form_sends_it_complete() -> None:
    events = parts(stream("messages"), ("messages", (AIMessage(content="hi", id="m2"), {})))
    assert [e for e, _ in events] == ["messages/metadata", "messages/complete"]


def test_given_messages_tuple_then_each_chunk_is_sent_as_it_is() -> None:
    chunk = AIMessageChunk(content="hi", id="m3")
    events = parts(stream("messages-tuple", "messages"), ("messages", (chunk, {"a": 1})))
    assert events == [("messages", (chunk, {"a": 1}))]
    assert stream("messages-tuple", "events").graph_modes == ["messages", "custom"]


def test_given_a_debug_checkpoint_then_it_names_its_checkpoints_by_the_clients_thread() -> None:
    config = {
        "configurable": {"thread_id": "tenant/t1", "checkpoint_ns": "", "checkpoint_id": "c2"}
    }
    parent = {
        "configurable": {"thread_id": "tenant/t1", "checkpoint_ns": "", "checkpoint_id": "c1"}
    }
    payload = {"config": config, "parent_config": parent, "tasks": [{"id": "x", "name": "model"}]}

    [(event, data)] = parts(stream("debug"), ("debug", {"type": "checkpoint", "payload": payload}))

    assert event == "debug"
    assert data["payload"]["checkpoint"] == {
        "thread_id": "t1",
        "checkpoint_ns": "",
        "checkpoint_id": "c2",
    }
    assert data["payload"]["parent_checkpoint"]["checkpoint_id"] == "c1"
