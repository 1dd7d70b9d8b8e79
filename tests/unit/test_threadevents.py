"""The thread-centric protocol's events made of a run's logged parts, and the stream's
filter (orchestrator.server.threadevents)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.server.encoding import dumps
from orchestrator.server.eventlog import Entry
from orchestrator.server.records import RunRecord
from orchestrator.server.threadevents import Filter, RunEvents, parse_filter

RUN = RunRecord(
    run_id="r1",
    thread_id="t1",
    assistant_id="a1",
    created_at="2026-01-01T00:00:00+00:00",
    updated_at="2026-01-01T00:00:00+00:00",
    status="running",
    replica="x",
)


def events_of(*parts: tuple[str, Any]) -> tuple[RunEvents, list[dict[str, Any]]]:
    run = RunEvents(RUN, "graph")
    out: list[dict[str, Any]] = []
    for n, (name, data) in enumerate(parts):
        out.extend(run.entry(Entry(f"1700000000000-{n}", name, dumps(data))))
    return run, out


def test_an_older_routes_interrupt_is_an_input_request_before_its_values() -> None:
    """Given a run of another route whose values carry ``__interrupt__``, then its events
    are the request for input, the root's ``interrupted`` and the values without it; the
    run's end adds no second lifecycle event."""
    values = {"request": "a", "__interrupt__": [{"value": {"q": 1}, "id": "i1"}]}
    run, out = events_of(("values", {"request": "a"}), ("values", values))

    assert [e["method"] for e in out] == ["values", "input.requested", "lifecycle", "values"]
    assert out[1]["params"]["data"] == {"interrupt_id": "i1", "payload": {"q": 1}}
    assert out[1]["event_id"] == "synth:r1:input||i1"
    assert out[2]["params"]["data"] == {"event": "interrupted", "graph_name": "graph"}
    assert out[3]["params"]["data"] == {"request": "a"}
    assert out[3]["event_id"] == "1700000000000-1.2"  # the entry's third event
    assert run.end("success") == []


def test_updates_name_their_node_and_older_message_parts_are_left_out() -> None:
    _, out = events_of(
        ("updates|sub:1", {"model": {"messages": [{"type": "ai", "content": "hi"}]}}),
        ("messages", [{"content": "h", "type": "AIMessageChunk"}, {}]),
        ("debug", {"type": "checkpoint"}),
    )

    assert len(out) == 1
    assert out[0]["method"] == "updates"
    assert out[0]["params"]["namespace"] == ["sub:1"]
    assert out[0]["params"]["node"] == "model"
    assert out[0]["params"]["data"] == {
        "node": "model",
        "values": {"messages": [{"type": "ai", "content": "hi"}]},
    }


def test_protocol_events_are_passed_on_in_the_protocols_forms() -> None:
    """A command's run logged LangGraph's protocol events: a message event's metadata is
    dropped, ``custom:<name>`` becomes ``custom`` ``{name, payload}``, a finished tool
    call is mirrored as a ``tool`` message, the root's own lifecycle is not repeated."""

    def event(method: str, data: Any, namespace: list[str] | None = None) -> dict[str, Any]:
        params = {"namespace": namespace or [], "timestamp": 5, "data": data}
        return {"type": "event", "method": method, "params": params}

    output = {"type": "tool", "content": "5", "tool_call_id": "c1", "id": None}
    finished = {"event": "tool-finished", "tool_call_id": "c1", "output": output}
    _, out = events_of(
        ("lifecycle", event("lifecycle", {"event": "running"})),
        ("messages", event("messages", [{"event": "message-start", "role": "ai"}, {"m": 1}])),
        ("custom:progress", event("custom:progress", {"done": 1})),
        ("tools", event("tools", finished)),
    )

    assert out[0]["params"]["data"] == {"event": "message-start", "role": "ai"}
    assert out[0]["params"]["timestamp"] == 5
    assert out[1]["method"] == "custom"
    assert out[1]["params"]["data"] == {"name": "progress", "payload": {"done": 1}}
    assert out[2]["method"] == "tools"
    mirrored = out[3:]
    assert [e["params"]["data"]["event"] for e in mirrored] == [
        "message-start",
        "content-block-start",
        "content-block-delta",
        "content-block-finish",
        "message-finish",
    ]
    assert all(e["params"]["namespace"] == ["tools:c1"] for e in mirrored)
    assert mirrored[0]["params"]["data"]["id"] == "tool-c1"
    assert mirrored[2]["params"]["data"]["content"] == {"type": "text", "text": "5"}


def test_a_failed_run_ends_failed_with_its_error() -> None:
    run = RunEvents(
        RunRecord(**{**RUN.__dict__, "error": {"error": "ValueError", "message": "bad role"}}),
        "graph",
    )

    [end] = run.end("error")

    assert end["params"]["data"] == {"event": "failed", "graph_name": "graph", "error": "bad role"}
    assert end["event_id"] == "synth:r1:lc||failed"


def test_the_filter_takes_channels_namespaces_and_depth() -> None:
    wanted = Filter(frozenset({"messages", "input", "custom:a"}), (("sub",),), depth=1)

    def ev(method: str, namespace: list[str], data: Any = None) -> dict[str, Any]:
        return {"method": method, "params": {"namespace": namespace, "data": data}}

    assert wanted.matches(ev("messages", ["sub"]))
    assert wanted.matches(ev("messages", ["sub", "x"]))
    assert not wanted.matches(ev("messages", ["sub", "x", "y"]))  # deeper than 1
    assert not wanted.matches(ev("messages", []))
    assert wanted.matches(ev("input.requested", ["sub"]))
    assert wanted.matches(ev("custom", ["sub"], {"name": "a", "payload": 1}))
    assert not wanted.matches(ev("custom", ["sub"], {"name": "b", "payload": 1}))
    assert not wanted.matches(ev("values", ["sub"]))
    assert Filter(frozenset({"values"})).matches(ev("values", ["any", "where"]))


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ([], "JSON object"),
        ({}, "channels"),
        ({"channels": []}, "channels"),
        ({"channels": ["values", "nope"]}, "'nope'"),
        ({"channels": ["custom:"]}, "custom:"),
        ({"channels": ["values"], "depth": -1}, "depth"),
        ({"channels": ["values"], "depth": True}, "depth"),
        ({"channels": ["values"], "since": "3"}, "since"),
        ({"channels": ["values"], "namespaces": [[1]]}, "namespaces"),
        ({"channels": ["values"], "filter": 1}, "filter"),
    ],
)
def test_bad_stream_bodies_are_refused_by_name(body: Any, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_filter(body)


def test_a_good_stream_body() -> None:
    wanted, since = parse_filter(
        {"channels": ["values", "custom:x"], "namespaces": [["a"]], "depth": 0, "since": 7}
    )

    assert wanted == Filter(frozenset({"values", "custom:x"}), (("a",),), 0)
    assert since == 7
