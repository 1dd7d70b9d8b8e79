"""Remote calls on real workers fire the orchestrator's LangChain tool callbacks as a local
call does, in sync and async runs (a recording handler passed in the run's config)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

from orchestrator import CeleryToolMiddleware, dispatcher_for
from orchestrator.observe import RemoteToolError
from tests import fleet_tools
from tests.support.callbacks import Recorder
from tests.support.fleet import one_turn
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def run_agent(
    mode: str, calls: list[tuple[str, dict[str, Any]]], middleware: list[Any]
) -> Recorder:
    recorder = Recorder()
    agent = create_agent(
        one_turn(calls), [fleet_tools.add, fleet_tools.boom], middleware=middleware
    )
    config: Any = {"callbacks": [recorder], "tags": ["t1"], "metadata": {"user": "ana"}}
    payload = {"messages": [HumanMessage("go")]}
    if mode == "invoke":
        agent.invoke(payload, config)
    else:
        asyncio.run(agent.ainvoke(payload, config))
    return recorder


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_given_a_call_run_by_a_worker_then_its_callbacks_are_those_of_a_local_call(
    shared_fleet: Settings, mode: str
) -> None:
    """Given a handler in the run's config, when a tool call runs on a real worker, then
    the handler sees the same on_tool_start and on_tool_end as for the same call run
    locally: name, description, input, tags, metadata, parent run and output."""
    calls = [("add", {"a": 2, "b": 3})]
    remote_middleware = [CeleryToolMiddleware(dispatcher=dispatcher_for(settings=shared_fleet))]

    local = run_agent(mode, calls, [])
    remote = run_agent(mode, calls, remote_middleware)

    assert remote.events == local.events
    assert [e["event"] for e in remote.events] == ["start", "end"]
    assert remote.events[0]["name"] == "add" and remote.events[0]["has_parent"]
    assert "t1" in remote.events[0]["tags"] and remote.events[0]["metadata"] == {"user": "ana"}
    assert remote.events[1]["output"] == ("ToolMessage", "5")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_given_a_tool_failing_on_a_worker_then_on_tool_error_carries_the_models_text(
    shared_fleet: Settings, mode: str
) -> None:
    """Given a tool that raises on its worker, when the agent calls it, then the handler
    sees on_tool_start with the call's arguments and on_tool_error with the text the
    model is given."""
    remote_middleware = [CeleryToolMiddleware(dispatcher=dispatcher_for(settings=shared_fleet))]

    remote = run_agent(mode, [("boom", {"reason": "disk full"})], remote_middleware)

    start, error = remote.events
    assert (start["event"], start["name"], start["inputs"]) == (
        "start",
        "boom",
        {"reason": "disk full"},
    )
    assert error["event"] == "error" and error["type"] == RemoteToolError.__name__
    assert "boom: disk full" in error["text"]
