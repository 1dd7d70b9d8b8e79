"""Closing a thread whose run stopped with calls unanswered keeps what did finish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt.tool_node import ToolCallRequest

from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from orchestrator.transcript import close_pending_calls, pending_calls
from tests.support.fleet import wait_until
from tool_workers.contract.errors import DispatchError


@tool
def echo(text: str) -> str:
    """Echo ``text``."""
    return f"echo {text}"


class FailsOne(AgentMiddleware):
    """Fails the run at the call whose text is ``fail`` (as a broker that is down does),
    once the call ``after`` names has its result saved as a pending write of the step
    (otherwise which call ends first is the machine's choice)."""

    def __init__(self, checkpointer: InMemorySaver, config: Any, after: str) -> None:
        super().__init__()
        self.checkpointer, self.config, self.after = checkpointer, config, after

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]
    ) -> Any:
        if request.tool_call["args"]["text"] == "fail":
            wait_until(self._saved, 30, "the other call's pending write")
            raise DispatchError("could not publish 1 tool call(s)")
        return handler(request)

    def _saved(self) -> bool:
        saved = self.checkpointer.get_tuple(self.config)
        return saved is not None and any(
            self.after in repr(value) for _, _, value in saved.pending_writes or []
        )


def test_given_a_sync_run_failed_mid_fan_out_when_closed_then_finished_results_are_kept() -> None:
    """Given a sync fan-out where one call fails the run and the others finished (their
    results are the failed step's pending writes), when the thread is closed, then the
    finished calls keep their real results and only the failed one gets an error."""
    calls = tool_calls_message([("echo", {"text": "a"}), ("echo", {"text": "fail"})])
    model = ScriptedChatModel(script=[calls, AIMessage(content="later")])
    config: dict[str, Any] = {"configurable": {"thread_id": "failed"}}
    checkpointer = InMemorySaver()
    fails = FailsOne(checkpointer, config, after=calls.tool_calls[0]["id"])
    agent = create_agent(
        model,
        [echo],
        middleware=[fails, CeleryToolMiddleware(dispatcher=InProcessDispatcher([echo]))],
        checkpointer=checkpointer,
    )
    with pytest.raises(DispatchError):
        agent.invoke({"messages": [("user", "go")]}, config)

    answers = close_pending_calls(agent, config, reason="the run failed")

    assert [a.tool_call_id for a in answers] == [calls.tool_calls[1]["id"]]
    messages = agent.get_state(config).values["messages"]
    results = {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}
    assert results[calls.tool_calls[0]["id"]] == "echo a"
    assert "may have run" in str(results[calls.tool_calls[1]["id"]])
    assert len([m for m in messages if isinstance(m, ToolMessage)]) == 2
    assert pending_calls(agent.get_state(config).values) == []
