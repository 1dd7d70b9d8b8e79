"""The parity tests' agent: LangChain's create_agent with the test model streaming its
answers word by word, its tool calls run on the fleet.

Both servers serve this project (``toolfleet serve --config`` and ``langgraph dev``), so
the same graph answers the same scenario on each. Compiled without a checkpointer: the
servers supply their own.
"""

from __future__ import annotations

from langchain.agents import create_agent

from orchestrator import CeleryToolMiddleware, discover_tools
from tests.server_models import streaming

graph = create_agent(
    streaming(),
    discover_tools(wait=30),
    system_prompt="You run tools on the fleet.",
    middleware=[CeleryToolMiddleware()],
    name="fleet agent",
)
