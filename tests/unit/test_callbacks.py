"""Remote calls fire the orchestrator's LangChain tool callbacks as local calls do."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from orchestrator.callbacks import RemoteToolError
from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.scripted import ScriptedChatModel, tool_calls_message


@tool
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


class Recorder(BaseCallbackHandler):
    """Every tool callback, with what a tracer would record of it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.events.append(
            {
                "event": "start",
                "name": serialized["name"],
                "description": serialized.get("description"),
                "input": input_str,
                "inputs": inputs,
                "has_parent": parent_run_id is not None,
                "tags": sorted(tags or []),
                "metadata": {k: v for k, v in (metadata or {}).items() if k == "user"},
            }
        )

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        self.events.append({"event": "end", "output": (type(output).__name__, output.content)})

    def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self.events.append({"event": "error", "type": type(error).__name__, "text": str(error)})


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
