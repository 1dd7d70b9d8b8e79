"""RemoteToolNode in hand-built graphs, and tools the orchestrator only knows by schema."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Send

from orchestrator import RemoteToolNode, ScriptedChatModel, discover_tools, dispatcher_for
from orchestrator.scripted import tool_calls_message
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def test_tools_condition_graph(shared_fleet: Settings) -> None:
    """Given a model -> tools_condition -> RemoteToolNode loop, when the model calls tools,
    then the node runs them on the workers and the loop goes back to the model."""
    dispatcher = dispatcher_for(settings=shared_fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["add", "whoami"], wait=10)
    model = ScriptedChatModel(
        script=[
            tool_calls_message([("add", {"a": 1, "b": 2}), ("whoami", {})]),
            AIMessage(content="done"),
        ]
    )
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", RemoteToolNode(tools, dispatcher=dispatcher))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    app = graph.compile()

    state = app.invoke({"messages": [("user", "hi")]})

    add, who = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert add.content == "3"
    assert who.content.startswith("pid=")
    assert state["messages"][-1].content == "done"


class FanOutState(TypedDict):
    messages: Annotated[list[AnyMessage], operator.add]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_explicit_send_fan_out(shared_fleet: Settings, mode: str) -> None:
    """Given a graph that fans out with Send("tools", [call]) per call, when run, then each
    Send runs on a worker and every result is gathered."""
    dispatcher = dispatcher_for(settings=shared_fleet)
    tools = discover_tools(dispatcher=dispatcher, require=["sleep_for"], wait=10)
    ai = tool_calls_message([("sleep_for", {"seconds": 0.2, "label": str(i)}) for i in range(10)])

    def fan_out(state: FanOutState) -> list[Send]:
        return [Send("tools", [call]) for call in state["messages"][-1].tool_calls]

    graph = StateGraph(FanOutState)
    graph.add_node("model", lambda state: {"messages": [ai]})
    graph.add_node("tools", RemoteToolNode(tools, dispatcher=dispatcher))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", fan_out, ["tools"])
    graph.add_edge("tools", END)
    app = graph.compile()

    payload: dict[str, Any] = {"messages": [("user", "hi")]}
    state = app.invoke(payload) if mode == "sync" else asyncio.run(app.ainvoke(payload))

    results = sorted(m.content for m in state["messages"] if isinstance(m, ToolMessage))
    assert results == sorted(f"{i} 0.2" for i in range(10))


def test_discovered_tool_invoked_directly(shared_fleet: Settings) -> None:
    """Given a schema-only tool from the registry, when invoked outside any agent, then it
    dispatches itself to the workers; errors become error ToolMessages."""
    dispatcher = dispatcher_for(settings=shared_fleet)
    tools = {t.name: t for t in discover_tools(dispatcher=dispatcher, require=["add"], wait=10)}

    assert tools["add"].invoke({"a": 40, "b": 2}) == "42"
    message = tools["boom"].invoke(
        {"type": "tool_call", "name": "boom", "args": {"reason": "x"}, "id": "c1"}
    )
    assert message.status == "error" and "boom: x" in message.content
    assert tools["add"].args == {"a": {"type": "integer"}, "b": {"type": "integer"}}
