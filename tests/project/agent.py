"""The project's agent: LangChain's create_agent, its tool calls run on the fleet.

Compiled with a checkpointer of its own, which the server replaces with its own (as
LangGraph's server does).
"""

from __future__ import annotations

from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

from orchestrator import CeleryToolMiddleware, discover_tools
from tests.server_models import directed

graph = create_agent(
    directed(),
    discover_tools(wait=30),
    system_prompt="You run tools on the fleet.",
    middleware=[CeleryToolMiddleware()],
    checkpointer=InMemorySaver(),
    name="fleet agent",
)
