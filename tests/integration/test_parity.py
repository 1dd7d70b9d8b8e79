"""Agent Protocol parity: one recorded ``langgraph-sdk`` scenario against ``toolfleet serve``
and against LangGraph's own server (``langgraph dev``), compared by shape.

Both serve tests/parity_project (its ``fleet`` graph: ``create_agent`` with the directed
test model, streaming its answers word by word, and ``CeleryToolMiddleware``) over one
prefork fleet; each is started once for the module and stopped by its pid. See
tests/support/parity.py for what is compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fleet import REPO
from tests.support.langgraph_dev import start_langgraph_dev
from tests.support.parity import Recording, Ref, Step, compare, record, report
from tests.support.serving import ServerProcess, prefork_fleet, run, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(300)

PROJECT = REPO / "tests" / "parity_project" / "langgraph.json"


@pytest.fixture(scope="module")
def ours(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("parity-ours"),
        "ours",
        args=("--config", str(PROJECT)),
        model=None,
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def langgraph(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = start_langgraph_dev(prefork_fleet, PROJECT, tmp_path_factory.mktemp("parity-lg"))
    yield server
    server.stop()


def ask(*calls: tuple[str, dict[str, Any]], model_delay: float = 0) -> dict[str, Any]:
    """Run input whose user message makes the test model call ``calls`` at once."""
    text = json.dumps({"calls": [list(c) for c in calls], "model_delay": model_delay})
    return {"messages": [{"role": "user", "content": text}]}


def both(
    ours: ServerProcess, langgraph: ServerProcess, scenario: list[Step]
) -> tuple[Recording, Recording]:
    """The scenario's recording on each server (ours first)."""
    mine = run(record(ours.url, scenario, api_key=ours.settings.api_tokens[0]))
    theirs = run(record(langgraph.url, scenario))
    return mine, theirs


def assert_same(
    ours: ServerProcess,
    langgraph: ServerProcess,
    scenario: list[Step],
    allowed: tuple[str, ...] = (),
) -> None:
    mine, theirs = both(ours, langgraph, scenario)
    differences = compare(mine, theirs, allowed)
    assert not differences, report(differences)


OPEN = (
    # Threads.
    "(threads.create).body.interrupts:",
    "(threads.get).body.error:",
    # Runs: the server's own kwargs record, LangSmith's project, our extensions.
    ".kwargs.",
    ".langsmith_session_name: only langgraph",
    ".replica: only ours",
    ".error: only ours",
    # LangGraph's server's own keys in a run's config (debug payloads).
    ".configurable.__request_start_time_ms__:",
    ".configurable.__after_seconds__:",
    ".configurable.langgraph_auth_permissions:",
    # Messages streamed from the model call: LangGraph's server encodes them after
    # create_agent has named the message (it sets the name after the call returns).
    "[0].name: ours None, langgraph 'str'",
    ".data.output.name: ours None, langgraph 'str'",
    ".data.output.id: ours",  # likewise: whether the model's message has its id yet
    # Cancel: LangGraph answers 202 without a body, or the run's result with wait.
    "(runs.cancel).body",
)
"""Differences the oracle shows that are not closed yet, each by the path it names."""

THREAD = Ref("thread", "thread_id")

RUN_AND_STATE = [
    Step("thread", "threads.create", note="a new thread"),
    Step("empty", "threads.get_state", args=(THREAD,), note="a new thread's state"),
    Step(
        "stream",
        "runs.stream",
        args=(THREAD, "fleet"),
        kwargs={
            "input": ask(("add", {"a": 2, "b": 3})),
            "stream_mode": ["values", "updates"],
        },
        note="a run with one tool call, streamed",
    ),
    Step("after", "threads.get", args=(THREAD,)),
    Step("state", "threads.get_state", args=(THREAD,)),
    Step("history", "threads.get_history", args=(THREAD,), kwargs={"limit": 2}),
    Step("runs", "runs.list", args=(THREAD,)),
]


def test_a_streamed_run_and_the_thread_after_it(
    ours: ServerProcess, langgraph: ServerProcess
) -> None:
    """Given both servers, when a thread is created, streamed a run with a tool call and
    read back, then every answer has the same shape and the streams the same events."""
    assert_same(ours, langgraph, RUN_AND_STATE, allowed=OPEN)


def _started(state: dict[str, Any]) -> bool:
    """The run is in its model call (the checkpoint before it names it next)."""
    return list(state.get("next") or ()) == ["model"]


FIRST = Ref("first", "run_id")
SECOND = Ref("second", "run_id")

BUSY_THREAD = [
    Step("thread", "threads.create"),
    Step(
        "first",
        "runs.create",
        args=(THREAD, "fleet"),
        kwargs={"input": ask(("sleep_for", {"seconds": 1.0}))},
    ),
    Step(
        "second",
        "runs.create",
        args=(THREAD, "fleet"),
        kwargs={"input": {"messages": [{"role": "user", "content": "next"}]}},
        note="a second run on a busy thread, no strategy given: queued after the first",
    ),
    Step("first-done", "runs.join", args=(THREAD, FIRST)),
    Step("second-done", "runs.join", args=(THREAD, SECOND)),
    Step("runs", "runs.list", args=(THREAD,)),
    Step("after", "threads.get", args=(THREAD,)),
]


def test_a_second_run_on_a_busy_thread_is_queued_by_default(
    ours: ServerProcess, langgraph: ServerProcess
) -> None:
    """Given a running run, when a second run is created on its thread without a
    multitask strategy, then both servers queue it and run it after the first."""
    assert_same(ours, langgraph, BUSY_THREAD, allowed=OPEN)


SLOW = ask(("add", {"a": 1, "b": 1}), model_delay=30)

CANCELLED = [
    Step("thread", "threads.create"),
    Step("first", "runs.create", args=(THREAD, "fleet"), kwargs={"input": SLOW}),
    Step("started", "threads.get_state", args=(THREAD,), until=_started),
    Step("cancel", "runs.cancel", args=(THREAD, FIRST), kwargs={"wait": True}),
    Step("run", "runs.get", args=(THREAD, FIRST)),
    Step("after", "threads.get", args=(THREAD,), note="a cancelled run's thread"),
]


def test_a_cancelled_run_leaves_its_thread_interrupted(
    ours: ServerProcess, langgraph: ServerProcess
) -> None:
    """Given a run stopped in its model call, when it is cancelled, then its thread is
    ``interrupted`` on both servers (its next step still to run)."""
    assert_same(ours, langgraph, CANCELLED, allowed=OPEN)


ROLLED_BACK = [
    Step("thread", "threads.create"),
    Step(
        "kept",
        "runs.wait",
        args=(THREAD, "fleet"),
        kwargs={"input": ask(("add", {"a": 1, "b": 2}))},
    ),
    Step("first", "runs.create", args=(THREAD, "fleet"), kwargs={"input": SLOW}),
    Step("started", "threads.get_state", args=(THREAD,), until=_started),
    Step(
        "cancel",
        "runs.cancel",
        args=(THREAD, FIRST),
        kwargs={"wait": True, "action": "rollback"},
        note="cancel with rollback",
    ),
    Step("runs", "runs.list", args=(THREAD,), note="the rolled-back run is gone"),
    Step("state", "threads.get_state", args=(THREAD,), note="the state before it"),
    Step("history", "threads.get_history", args=(THREAD,), kwargs={"limit": 20}),
    Step("after", "threads.get", args=(THREAD,)),
    Step("slow", "runs.create", args=(THREAD, "fleet"), kwargs={"input": SLOW}),
    Step("started-again", "threads.get_state", args=(THREAD,), until=_started),
    Step(
        "second",
        "runs.create",
        args=(THREAD, "fleet"),
        kwargs={"input": ask(("add", {"a": 2, "b": 2})), "multitask_strategy": "rollback"},
        note="a run that rolls back the thread's running one",
    ),
    Step("second-done", "runs.join", args=(THREAD, SECOND)),
    Step("runs-after", "runs.list", args=(THREAD,)),
    Step("history-after", "threads.get_history", args=(THREAD,), kwargs={"limit": 20}),
]


def test_rollback_deletes_the_run_and_its_checkpoints(
    ours: ServerProcess, langgraph: ServerProcess
) -> None:
    """Given a thread with one finished run, when a second run is cancelled with
    ``rollback`` (or rolled back by a third run's multitask strategy), then the run and
    its checkpoints are gone on both servers and the thread is as it was before it."""
    assert_same(ours, langgraph, ROLLED_BACK, allowed=OPEN)


def _streamed(name: str, modes: list[str]) -> list[Step]:
    return [
        Step("thread", "threads.create"),
        Step(
            name,
            "runs.stream",
            args=(THREAD, "fleet"),
            kwargs={"input": ask(("add", {"a": 2, "b": 3})), "stream_mode": modes},
            note=f"stream_mode {modes}",
        ),
    ]


@pytest.mark.parametrize(
    "modes",
    [["messages-tuple"], ["messages"], ["events"], ["debug"], ["values", "messages", "custom"]],
    ids=lambda modes: "+".join(modes),
)
def test_stream_modes(ours: ServerProcess, langgraph: ServerProcess, modes: list[str]) -> None:
    """Given a run with a tool call, when it is streamed in ``modes``, then both servers
    send the same events, of the same shapes."""
    assert_same(ours, langgraph, _streamed("stream", modes), allowed=OPEN)


STREAMED_RUN = Ref("stream", 0, "data", "run_id")
SECOND_PART = Ref("stream", 2, "id")

RECONNECTED = [
    Step("thread", "threads.create"),
    Step(
        "stream",
        "runs.stream",
        args=(THREAD, "fleet"),
        kwargs={
            "input": ask(("add", {"a": 2, "b": 3})),
            "stream_mode": ["values", "updates"],
            "stream_resumable": True,
        },
    ),
    Step(
        "resumed",
        "runs.join_stream",
        args=(THREAD, STREAMED_RUN),
        kwargs={"last_event_id": SECOND_PART},
        note="reconnected after the second part, no modes given",
        kinds_only=True,
    ),
    Step(
        "resumed-values",
        "runs.join_stream",
        args=(THREAD, STREAMED_RUN),
        kwargs={"last_event_id": SECOND_PART, "stream_mode": "values"},
        note="reconnected for values",
        kinds_only=True,
    ),
]


def test_reconnecting_to_a_stream_replays_only_what_the_run_streamed(
    ours: ServerProcess, langgraph: ServerProcess
) -> None:
    """Given a resumable run streamed for values and updates, when a client reconnects
    after its second part (with no modes, then for values), then both servers send the
    later parts of those modes only: no second ``metadata``, no unrequested ``custom``."""
    assert_same(ours, langgraph, RECONNECTED, allowed=OPEN)


COPY = Ref("copy", "thread_id")
FLEET = Ref("assistant", 0, "assistant_id")

BEYOND_RUNS = [
    Step("thread", "threads.create", kwargs={"metadata": {"team": "a"}}),
    Step("update", "threads.update", args=(THREAD,), kwargs={"metadata": {"stage": "one"}}),
    Step("count", "threads.count", kwargs={"metadata": {"team": "a", "stage": "one"}}),
    Step(
        "run", "runs.wait", args=(THREAD, "fleet"), kwargs={"input": ask(("add", {"a": 1, "b": 2}))}
    ),
    Step(
        "edit",
        "threads.update_state",
        args=(THREAD, {"messages": [{"role": "user", "content": "an edit"}]}),
        kwargs={"as_node": "model"},
        note="a human edit as the model node",
    ),
    Step("edited", "threads.get_state", args=(THREAD,)),
    Step("copy", "threads.copy", args=(THREAD,)),
    Step("copied", "threads.get_history", args=(COPY,), kwargs={"limit": 3}),
    Step("assistant", "assistants.search", kwargs={"graph_id": "fleet"}),
    Step("assistants", "assistants.count"),
    Step("graph", "assistants.get_graph", args=(FLEET,), kwargs={"xray": True}),
    Step("schemas", "assistants.get_schemas", args=(FLEET,)),
    Step("subgraphs", "assistants.get_subgraphs", args=(FLEET,), kwargs={"recurse": True}),
    Step("put", "store.put_item", args=(["parity", "notes"], "n1", {"text": "hi"})),
    Step("item", "store.get_item", args=(["parity", "notes"], "n1")),
    Step("search", "store.search_items", args=(["parity"],), kwargs={"filter": {"text": "hi"}}),
    Step("namespaces", "store.list_namespaces", kwargs={"prefix": ["parity"]}),
    Step("delete", "store.delete_item", args=(["parity", "notes"], "n1")),
    Step("gone", "store.get_item", args=(["parity", "notes"], "n1")),
    Step("batch", "runs.create_batch", args=([{"assistant_id": "fleet", "input": ask()}],)),
    Step(
        "cancel",
        "runs.cancel_many",
        kwargs={"thread_id": THREAD, "run_ids": [Ref("batch", 0, "run_id")]},
        note="a run of another thread: nothing matches (404)",
    ),
]

BEYOND_OPEN = (
    # A Thread's fields, as for threads.create and threads.get above.
    "(threads.update).body.config:",
    "(threads.update).body.interrupts:",
    "(threads.update).body.values:",
    "(threads.copy).body.config:",
    "(threads.copy).body.interrupts:",
    "(threads.copy).body.values: only ours",  # LangGraph's copy answers no values
    # A run's checkpoints: LangGraph's server copies the thread's metadata into them.
    ".metadata.team: only langgraph",
    ".metadata.stage: only langgraph",
    # A stateless run's metadata: ours names its graph (as for runs on a thread).
    "(runs.create_batch).body[0].metadata.graph_id: only ours",
)
"""Differences of the steps beyond runs, each outside the endpoints they exercise."""


def test_thread_assistant_store_and_batch_calls(
    ours: ServerProcess, langgraph: ServerProcess
) -> None:
    """Given both servers, when a thread is updated, counted, run, edited by hand and
    copied, the assistant's graph and schemas read, the store written, searched and
    emptied, and a batch of runs started, then every answer has the same shape."""
    assert_same(ours, langgraph, BEYOND_RUNS, allowed=OPEN + BEYOND_OPEN)
