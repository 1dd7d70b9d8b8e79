"""Remote calls fire the orchestrator's LangChain tool callbacks as local calls do."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.observe import RemoteToolError
from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from tests.support.callbacks import Recorder


@tool
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


def run_agent(mode: str, *, remote: bool, calls: list[tuple[str, dict[str, Any]]]) -> Recorder:
    recorder = Recorder()
    model = ScriptedChatModel(script=[tool_calls_message(calls), AIMessage(content="done")])
    middleware = [CeleryToolMiddleware(dispatcher=InProcessDispatcher([shout, explode]))]
    agent = create_agent(model, [shout, explode], middleware=middleware if remote else [])
    config: Any = {"callbacks": [recorder], "tags": ["t1"], "metadata": {"user": "ana"}}
    inputs = {"messages": [HumanMessage("go")]}
    if mode == "invoke":
        agent.invoke(inputs, config)
    else:
        asyncio.run(agent.ainvoke(inputs, config))
    return recorder


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_given_remote_call_then_callbacks_are_those_of_a_local_call(mode: str) -> None:
    calls = [("shout", {"text": "hi"})]

    local = run_agent(mode, remote=False, calls=calls)
    remote = run_agent(mode, remote=True, calls=calls)

    assert remote.events == local.events
    assert [e["event"] for e in remote.events] == ["start", "end"]
    assert "t1" in remote.events[0]["tags"] and remote.events[0]["has_parent"]
    assert remote.events[0]["metadata"] == {"user": "ana"}


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_given_remote_tool_failing_then_on_tool_error_with_the_models_text(mode: str) -> None:
    remote = run_agent(mode, remote=True, calls=[("explode", {"reason": "disk full"})])

    start, error = remote.events
    assert (start["event"], start["name"], start["inputs"]) == (
        "start",
        "explode",
        {"reason": "disk full"},
    )
    assert error == {
        "event": "error",
        "type": RemoteToolError.__name__,
        "text": "Error: RuntimeError('disk full')\n Please fix your mistakes.",
    }
