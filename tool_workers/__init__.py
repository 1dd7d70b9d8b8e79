"""toolfleet's worker side: ``celery -A tool_workers worker``.

Importing this package builds nothing: Celery's ``-A tool_workers`` finds the app in
:mod:`tool_workers.celery`, which loads the tool modules named by
``TOOLFLEET_TOOL_MODULES`` and registers one task per tool.
"""

from __future__ import annotations

from tool_workers.context import current_call
from tool_workers.progress import heartbeat
from tool_workers.protocol import PROTOCOL_VERSION, ToolRequest, ToolResult

__all__ = ["PROTOCOL_VERSION", "ToolRequest", "ToolResult", "current_call", "heartbeat"]
