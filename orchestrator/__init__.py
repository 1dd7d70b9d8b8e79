"""toolfleet's orchestrator side: the agent loop stays local, tool calls go to workers.

Example::

    from langchain.agents import create_agent
    from orchestrator import CeleryToolMiddleware, discover_tools

    agent = create_agent(model, discover_tools(), middleware=[CeleryToolMiddleware()])
"""

from __future__ import annotations

import importlib as _importlib
import typing

if typing.TYPE_CHECKING:
    # The agent side: what an agent author touches.
    from orchestrator.call import PreparedCall
    from orchestrator.deadline import with_deadline

    # The transport: the dispatcher seam and the Celery implementation behind it.
    from orchestrator.dispatch import (
        CeleryDispatcher,
        Dispatcher,
        InProcessDispatcher,
        dispatcher_for,
    )
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

# Where each public name lives. Importing the package imports none of them: a command
# line (``toolfleet``) starts, and answers Ctrl-C, before LangChain, LangGraph and Celery
# are loaded; the first use of a name imports its module.
_HOMES = {
    "PreparedCall": "orchestrator.call",
    "with_deadline": "orchestrator.deadline",
    "CeleryDispatcher": "orchestrator.dispatch",
    "Dispatcher": "orchestrator.dispatch",
    "InProcessDispatcher": "orchestrator.dispatch",
    "dispatcher_for": "orchestrator.dispatch",
    "CeleryToolMiddleware": "orchestrator.middleware",
    "RemoteToolNode": "orchestrator.node",
    "ScriptedChatModel": "orchestrator.scripted",
    "RemoteTool": "orchestrator.tools",
    "discover_tools": "orchestrator.tools",
    "aclose_pending_calls": "orchestrator.transcript",
    "close_pending_calls": "orchestrator.transcript",
    "ConfigError": "tool_workers.contract.errors",
    "DispatchError": "tool_workers.contract.errors",
    "ResultError": "tool_workers.contract.errors",
    "ResultTimeout": "tool_workers.contract.errors",
    "RunDeadlineExceeded": "tool_workers.contract.errors",
    "ToolfleetError": "tool_workers.contract.errors",
    "ToolLoadError": "tool_workers.contract.errors",
    "Settings": "tool_workers.contract.settings",
}


def __getattr__(name: str) -> typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
