"""The thread-centric protocol tests' project: the fleet agent (create_agent, its tool
calls run on the fleet) and ``approval``, a graph that stops for a human's answer.

Compiled without a checkpointer: the server supplies its own.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain.agents import create_agent
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from orchestrator import CeleryToolMiddleware, discover_tools
from tests.server_models import directed

graph = create_agent(
    directed(),
    discover_tools(wait=30),
    system_prompt="You run tools on the fleet.",
    middleware=[CeleryToolMiddleware()],
    name="fleet agent",
)


class Approval(TypedDict, total=False):
    request: str
    answer: Any
    done: bool


def ask(state: Approval) -> dict[str, Any]:
    """Stop until a human answers whether to go on with the request."""
    answer = interrupt({"question": f"go on with {state.get('request', '')}?"})
    return {"answer": answer}


def act(state: Approval) -> dict[str, Any]:
    return {"done": state.get("answer") == "yes"}


approval = (
    StateGraph(Approval)
    .add_node("ask", ask)
    .add_node("act", act)
    .add_edge(START, "ask")
    .add_edge("ask", "act")
    .add_edge("act", END)
    .compile()
)
