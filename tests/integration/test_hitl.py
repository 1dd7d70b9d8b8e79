"""Human-in-the-loop approval stays in the orchestrator: nothing is dispatched before a
decision, and a resumed run dispatches each approved call exactly once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from orchestrator import CeleryToolMiddleware, ScriptedChatModel, discover_tools, dispatcher_for
from orchestrator.scripted import tool_calls_message
from tests.support.fleet import effects
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def build(settings: Settings, interrupt_mode: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["touch", "add"], wait=15)
    model = ScriptedChatModel(script=[tool_calls_message(calls), AIMessage(content="done")])
    return create_agent(
        model,
        tools,
        middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"touch": True}, interrupt_mode=interrupt_mode),
            CeleryToolMiddleware(dispatcher=dispatcher),
        ],
        checkpointer=InMemorySaver(),
    )


def invoke(agent: Any, payload: Any, config: Any, mode: str) -> dict[str, Any]:
    if mode == "sync":
        return agent.invoke(payload, config)
    return asyncio.run(agent.ainvoke(payload, config))


def touches(counter: Any, settings: Settings) -> int:
    return sum(effects(counter, settings, "touch").values())


@pytest.mark.parametrize("interrupt_mode", ["batched", "per_call"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("decision", ["approve", "edit", "reject"])
def test_gated_call_runs_once_after_the_decision_and_never_before(
    shared_fleet: Settings, counter: Any, mode: str, interrupt_mode: str, decision: str
) -> None:
    """Given a gated remote tool and an ungated one in one AIMessage, when the run pauses
    for review, then the gated call has not been dispatched; resumed with the decision,
    an approved or edited call runs exactly once (with the edited arguments) and a rejected
    one never runs."""
    tag = f"hitl-{uuid.uuid4().hex[:6]}"
    agent = build(
        shared_fleet, interrupt_mode, [("touch", {"tag": tag}), ("add", {"a": 1, "b": 1})]
    )
    config = {"configurable": {"thread_id": tag}}
    baseline = touches(counter, shared_fleet)  # the shared fleet counts every test's calls

    paused = invoke(agent, {"messages": [("user", "go")]}, config, mode)
    assert "__interrupt__" in paused
    before = touches(counter, shared_fleet) - baseline

    answer = {
        "approve": {"type": "approve"},
        "edit": {
            "type": "edit",
            "edited_action": {"name": "touch", "args": {"tag": tag + "-edited"}},
        },
        "reject": {"type": "reject", "message": "not now"},
    }[decision]
    resume = answer if interrupt_mode == "per_call" else {"decisions": [answer]}
    state = invoke(agent, Command(resume=resume), config, mode)

    assert before == 0
    by_name = {m.name: m for m in state["messages"] if isinstance(m, ToolMessage)}
    assert by_name["add"].content == "2"
    runs = touches(counter, shared_fleet) - baseline
    if decision == "reject":
        assert runs == 0
        assert by_name["touch"].status == "error"
    else:
        assert runs == 1
        expected = tag + ("-edited" if decision == "edit" else "")
        assert f"touched {expected} (run 1)" in str(by_name["touch"].content)
    assert state["messages"][-1].content == "done"
