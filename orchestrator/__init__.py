"""toolfleet's orchestrator side: the agent loop stays local, tool calls go to workers.

Example::

    from langchain.agents import create_agent
    from orchestrator import CeleryToolMiddleware, discover_tools

    agent = create_agent(model, discover_tools(), middleware=[CeleryToolMiddleware()])
"""

from __future__ import annotations

# The agent side: what an agent author touches.
from orchestrator.call import PreparedCall
from orchestrator.deadline import with_deadline

# The transport: the dispatcher seam and the Celery implementation behind it.
from orchestrator.dispatch import CeleryDispatcher, Dispatcher, InProcessDispatcher, dispatcher_for
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.node import RemoteToolNode
from orchestrator.scripted import ScriptedChatModel
from orchestrator.tools import RemoteTool, discover_tools
from orchestrator.transcript import aclose_pending_calls, close_pending_calls

# Errors and settings (shared with the workers).
from tool_workers.contract.errors import (
    ConfigError,
    DispatchError,
    ResultError,
    ResultTimeout,
    RunDeadlineExceeded,
    ToolfleetError,
    ToolLoadError,
)
from tool_workers.contract.settings import Settings

__all__ = [
    "CeleryDispatcher",
    "CeleryToolMiddleware",
    "ConfigError",
    "DispatchError",
    "Dispatcher",
    "InProcessDispatcher",
    "PreparedCall",
    "RemoteTool",
    "RemoteToolNode",
    "ResultError",
    "ResultTimeout",
    "RunDeadlineExceeded",
    "ScriptedChatModel",
    "Settings",
    "ToolLoadError",
    "ToolfleetError",
    "aclose_pending_calls",
    "close_pending_calls",
    "discover_tools",
    "dispatcher_for",
    "with_deadline",
]
