"""create_agent, unchanged, plus CeleryToolMiddleware: every call runs on real workers."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from tests import fleet_tools
from tests.support.fleet import one_turn
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def run(agent: Any, mode: str, **config: Any) -> dict[str, Any]:
    payload = {"messages": [("user", "go")]}
    if mode == "sync":
        return agent.invoke(payload, config or None)
    return asyncio.run(agent.ainvoke(payload, config or None))


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


@pytest.fixture
def fleet(shared_fleet: Settings) -> Settings:
    return shared_fleet


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_calls_run_on_workers_in_call_order(fleet: Settings, mode: str) -> None:
    """Given real tools passed to create_agent, when the model fans out, then every call
    runs on a worker (none here) and the ToolMessages land in tool_calls order."""
    fleet_tools.LOCAL_RUNS.clear()
    calls = [
        ("sleep_for", {"seconds": 0.6, "label": "first"}),
        ("add", {"a": 2, "b": 3}),
        ("sleep_for", {"seconds": 0.3, "label": "third"}),
        ("echo_cls", {"text": "hi"}),
    ]
    tools = [fleet_tools.sleep_for, fleet_tools.add, fleet_tools.echo_cls]
    dispatcher = dispatcher_for(settings=fleet)
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )

    state = run(agent, mode)

    messages = tool_messages(state)
    ai = next(m for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    assert [m.tool_call_id for m in messages] == [c["id"] for c in ai.tool_calls]
    assert [m.content for m in messages] == ["first 0.6", "5", "third 0.3", "echo: hi"]
    assert all(m.status == "success" for m in messages)
    assert all(m.response_metadata["toolfleet"]["worker"].startswith("tf-") for m in messages)
    assert fleet_tools.LOCAL_RUNS == []
    assert state["messages"][-1].content == "done: 4 results"


@pytest.mark.serial  # the bound is the point: the other tests' processes would share it
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fan_out_is_parallel(fleet: Settings, mode: str) -> None:
    """Given 24 calls of a 0.5 s tool (more than LangGraph's 6 sync threads by default),
    when run with no run config (sync: the calls go out ahead of their hooks), then they
    overlap: far below the 12 s a serial run takes."""
    calls = [("sleep_for", {"seconds": 0.5, "label": str(i)}) for i in range(24)]
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["sleep_for"], wait=10)
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    run(agent, mode)  # warm up connections and the listener

    t0 = time.perf_counter()
    state = run(agent, mode)
    elapsed = time.perf_counter() - t0

    assert [m.content for m in tool_messages(state)] == [f"{i} 0.5" for i in range(24)]
    # Six-at-a-time would take 2 s; serial 12 s. The bound is generous for a noisy box.
    assert elapsed < 1.8, elapsed
    assert dispatcher.in_flight() == 0
    assert dispatcher.listener.pending() == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failures_are_error_tool_messages(fleet: Settings, mode: str) -> None:
    """Given a raising tool, bad arguments and an unknown tool, when called, then each gets
    an error ToolMessage the model can act on and the run completes."""
    calls = [
        ("boom", {"reason": "disk"}),
        ("add", {"a": "not a number", "b": 1}),
        ("no_such_tool", {}),
        ("add", {"a": 1, "b": 1}),
    ]
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["boom", "add"], wait=10)
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )

    state = run(agent, mode)

    boom, bad_args, unknown, ok = tool_messages(state)
    assert boom.status == "error"
    assert boom.content == "Error: ValueError('boom: disk')\n Please fix your mistakes."
    assert bad_args.status == "error"
    assert bad_args.content.startswith("Error invoking tool 'add' with kwargs")
    assert "a:" in bad_args.content
    assert unknown.status == "error"
    assert unknown.content.startswith("Error: no_such_tool is not a valid tool, try one of [")
    assert "add" in unknown.content
    assert ok.content == "2"
    assert state["messages"][-1].content == "done: 4 results"


def test_time_limit_names_the_limit(fleet: Settings) -> None:
    """Given tools past their time limits, when called, then error ToolMessages name the
    limit: the soft limit interrupts one; the hard limit kills the other's process."""
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["hang", "hard_hang"], wait=10)
    agent = create_agent(
        one_turn([("hang", {"seconds": 30}), ("hard_hang", {"seconds": 30})]),
        tools,
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    t0 = time.perf_counter()
    state = run(agent, "sync")
    elapsed = time.perf_counter() - t0

    soft, hard = tool_messages(state)
    assert soft.status == "error" and "time limit of 2 s" in soft.content
    assert hard.status == "error" and "time limit of 2 s" in hard.content
    assert elapsed < 2 + 2 + 3  # limit + 2 s, plus slack for a loaded machine


def test_content_blocks_and_artifacts_cross_the_wire(fleet: Settings) -> None:
    """Given tools returning content blocks, an artifact and a non-JSON artifact, when
    called, then blocks and artifact arrive intact and the non-JSON one is an error."""
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["blocks", "with_artifact"], wait=10)
    agent = create_agent(
        one_turn([("blocks", {}), ("with_artifact", {"n": 4}), ("opaque_artifact", {})]),
        tools,
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    blocks, artifact, opaque = tool_messages(run(agent, "async"))

    assert blocks.content == [
        {"type": "text", "text": "first"},
        {"type": "text", "text": "second"},
    ]
    assert artifact.content == "4 squares"
    assert artifact.artifact == {"squares": [0, 1, 4, 9]}
    assert opaque.status == "error" and "not JSON" in opaque.content


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_return_direct_ends_the_run(fleet: Settings, mode: str) -> None:
    """Given a discovered return_direct tool, when the model calls it, then the run ends
    with its ToolMessage and the model is not called again."""
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["finish"], wait=10)
    model = one_turn([("finish", {"answer": "42"})])
    agent = create_agent(model, tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)])

    state = run(agent, mode)

    assert isinstance(state["messages"][-1], ToolMessage)
    assert state["messages"][-1].content == "final: 42"
    assert model.calls == 1


def test_each_call_is_one_task(fleet: Settings, counter: Any) -> None:
    """Given a fan-out of side-effecting calls, when run sync (eager dispatch publishes the
    batch while later Send tasks attach), then each call ran exactly once."""
    from tests.support.fleet import effects

    calls = [("touch", {"tag": f"t{i}", "seconds": 0.1}) for i in range(15)]
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["touch"], wait=10)
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )

    before = effects(counter, fleet, "touch")  # the shared fleet counts every test's calls
    state = run(agent, "sync")

    after = effects(counter, fleet, "touch")
    runs = {key: n - before.get(key, 0) for key, n in after.items() if n != before.get(key)}
    assert len(runs) == 15
    assert set(runs.values()) == {1}
    assert all("(run 1)" in m.content for m in tool_messages(state))


@pytest.mark.parametrize("width", [3, 40], ids=["narrow", "wider_than_the_pool"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tool_call_events_stream_live(fleet: Settings, mode: str, width: int) -> None:
    """Given a fan-out, when streamed with stream_mode="custom", then each call reports
    dispatched, started (naming its worker) and finished (status and duration); a sync
    fan-out wider than LangGraph's pool too (its calls published ahead of their hooks)."""
    calls = [("sleep_for", {"seconds": 0.3, "label": str(i)}) for i in range(width)]
    dispatcher = dispatcher_for(settings=fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["sleep_for"], wait=10)
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    payload = {"messages": [("user", "go")]}

    if mode == "sync":
        chunks = list(agent.stream(payload, stream_mode="custom"))
    else:

        async def collect() -> list[Any]:
            return [c async for c in agent.astream(payload, stream_mode="custom")]

        chunks = asyncio.run(collect())

    events = [c["toolfleet"] for c in chunks if isinstance(c, dict) and "toolfleet" in c]
    by_call: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_call.setdefault(event["tool_call_id"], []).append(event)
    assert len(by_call) == width
    for seen in by_call.values():
        kinds = [e["event"] for e in seen]
        assert kinds.index("dispatched") < kinds.index("finished")
        assert "started" in kinds and kinds.index("started") < kinds.index("finished")
        started = next(e for e in seen if e["event"] == "started")
        assert started["worker"].startswith("tf-shared-")
        finished = next(e for e in seen if e["event"] == "finished")
        assert finished["status"] == "success" and finished["duration"] >= 0.3


def test_async_runs_publish_on_the_event_loop(fleet: Settings) -> None:
    """Given async runs fanning out, when they publish, then every call goes out from the
    event loop itself, in a script awaited there (no publishing thread involved, the
    first run included), and every call is answered (with the blocking-call detector on).

    A fan-out is batched by loop turns, so its calls may go out in more than one script
    when their hooks reach the dispatcher turns apart (a callback handler that hops to
    an executor): only where they are published is asserted."""
    dispatcher = dispatcher_for(settings=fleet)
    publisher = dispatcher._publisher
    blocking: list[str] = []
    on_loop: list[tuple[int, int, str]] = []
    lead, push = publisher._lead, publisher._push_on_loop
    phase = {"run": 0}

    def counted() -> Any:
        blocking.append(threading.current_thread().name)
        return lead()

    async def counted_on_loop(calls: Any) -> Any:
        on_loop.append((phase["run"], len(calls), threading.current_thread().name))
        return await push(calls)

    publisher._lead = counted  # type: ignore[method-assign]
    publisher._push_on_loop = counted_on_loop  # type: ignore[method-assign]
    calls = [("add", {"a": i, "b": 1}) for i in range(5)]
    agent = create_agent(
        one_turn(calls), [fleet_tools.add], middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )

    states = []
    for n in range(3):
        phase["run"] = n
        states.append(run(agent, "async"))

    assert blocking == []
    me = threading.current_thread().name
    for n in range(3):
        assert sum(size for run_, size, _ in on_loop if run_ == n) == len(calls), on_loop
    assert {name for _, _, name in on_loop} == {me}
    for state in states:
        assert [m.content for m in tool_messages(state)] == [str(i + 1) for i in range(5)]
