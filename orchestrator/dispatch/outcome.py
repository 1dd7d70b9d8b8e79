"""Turn what the result backend holds for a call into a ToolResult.

A worker's own result (SUCCESS) carries content, artifact and status. Celery records a
failure itself when the call never returned: the hard time limit killed it, no worker
knew the task, the worker was lost for good, or the call was revoked.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from orchestrator.messages import (
    bad_result_text,
    cancelled_text,
    not_served_there_text,
    unreadable_text,
    worker_lost_text,
)
from tool_workers.protocol import ToolResult, ToolSpec, error_text, timeout_text


def result_from_meta(meta: dict[str, Any], tool: str, spec: ToolSpec | None = None) -> ToolResult:
    """The ToolResult for a ready Celery meta of a call to ``tool``."""
    state = meta.get("status")
    payload = meta.get("result")
    if state == "SUCCESS":
        try:
            return ToolResult.model_validate(payload)
        except ValidationError as exc:
            return ToolResult.error("protocol", bad_result_text(tool, exc.error_count()))
    if state == "REVOKED":
        return ToolResult.error("cancelled", cancelled_text(tool))
    exc_type = payload.get("exc_type", "Exception") if isinstance(payload, dict) else "Exception"
    exc_message = payload.get("exc_message", ()) if isinstance(payload, dict) else ()
    detail = (
        ", ".join(str(part) for part in exc_message)
        if isinstance(exc_message, (list, tuple))
        else str(exc_message)
    )
    if exc_type == "TimeLimitExceeded":
        limit = spec.options.get("time_limit") if spec else None
        if limit is None:
            try:
                limit = float(detail)
            except ValueError:
                limit = None
        return ToolResult.error("timeout", timeout_text(tool, limit))
    if exc_type == "NotRegistered":
        return ToolResult.error("unknown_tool", not_served_there_text(tool))
    if exc_type in ("UnreadableCall", "ContentDisallowed", "DecodeError"):
        return ToolResult.error("protocol", unreadable_text(tool, detail))
    if exc_type == "WorkerLostError":
        return ToolResult.error("worker_lost", worker_lost_text(tool, detail))
    return ToolResult.error("tool_error", error_text(_Remote(exc_type, detail)))


class _Remote(Exception):
    """An exception that happened on a worker, shown with its original type name."""

    def __init__(self, type_name: str, detail: str) -> None:
        super().__init__(detail)
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"{self.type_name}({str(self)!r})"
