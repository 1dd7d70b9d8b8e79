"""A graph that asks the user a question (an interrupt) and greets them with the answer:
the A2A tests' task that needs input. No model, no tools."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def ask(state: State) -> dict[str, Any]:
    answer = interrupt("What is your name?")
    return {"messages": [AIMessage(content=f"hello {answer}")]}


builder = StateGraph(State)
builder.add_node("ask", ask)
builder.add_edge(START, "ask")
builder.add_edge("ask", END)
graph = builder.compile(name="asker")
