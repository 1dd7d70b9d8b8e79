"""The orchestrator's one log line per finished tool call.

The worker logs its own line for the same call (``side=worker``); both carry the
thread id, run id, tool call id and task id, so the two can be joined. Rendered as
JSON or key=value by :mod:`tool_workers.contract.logs`.
"""

from __future__ import annotations

import logging

from orchestrator.calls import PreparedCall
from tool_workers.contract.models import ToolResult

log = logging.getLogger("toolfleet.orchestrator.calls")


def log_finished(call: PreparedCall, result: ToolResult) -> None:
    """Log that ``call`` finished with ``result`` (at INFO)."""
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "tool call finished",
        extra={
            "toolfleet": {
                "side": "orchestrator",
                "tool": call.tool,
                "tool_call_id": call.call_id,
                "thread_id": call.thread_id,
                "run_id": call.run_id,
                "task_id": call.task_id,
                "worker": result.worker,
                "duration_ms": round(result.duration * 1000, 3),
                "outcome": result.error_kind or "success",
            }
        },
    )
