"""The project's agent: LangChain's create_agent, its tool calls run on the fleet.

Compiled without a checkpointer: the server supplies its own (``langgraph dev`` refuses
a graph that brings one).
"""

from __future__ import annotations

from langchain.agents import create_agent

from orchestrator import CeleryToolMiddleware, discover_tools
from tests.server_models import directed

graph = create_agent(
    directed(),
    discover_tools(wait=30),
    system_prompt="You run tools on the fleet.",
    middleware=[CeleryToolMiddleware()],
    name="fleet agent",
)
