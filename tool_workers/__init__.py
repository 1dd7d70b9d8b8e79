"""toolfleet's worker side: ``celery -A tool_workers worker``.

Importing this package builds nothing: Celery's ``-A tool_workers`` finds the app in
:mod:`tool_workers.celery`, which loads the tool modules named by
``TOOLFLEET_TOOL_MODULES`` and registers one task per tool.
"""

from __future__ import annotations

# What a tool author needs on the worker side, none of it importing Celery.
from tool_workers.context import CallContext, current_call
from tool_workers.progress import heartbeat

# The wire contract.
from tool_workers.protocol import PROTOCOL_VERSION, ToolRequest, ToolResult
from tool_workers.settings import Settings

__all__ = [
    "PROTOCOL_VERSION",
    "CallContext",
    "Settings",
    "ToolRequest",
    "ToolResult",
    "current_call",
    "heartbeat",
]
