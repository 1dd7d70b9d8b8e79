"""Turn what the result backend holds for a call into a ToolResult.

A worker's own result (SUCCESS) carries content, artifact and status. Celery records a
failure itself when the call never returned: the hard time limit killed it, no worker
knew the task, the worker was lost for good, or the call was revoked.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tool_workers.execute import error_text, timeout_text
from tool_workers.protocol import ToolResult, ToolSpec


def result_from_meta(meta: dict[str, Any], tool: str, spec: ToolSpec | None = None) -> ToolResult:
    """The ToolResult for a ready Celery meta of a call to ``tool``."""
    state = meta.get("status")
    payload = meta.get("result")
    if state == "SUCCESS":
        try:
            return ToolResult.model_validate(payload)
        except ValidationError as exc:
            return ToolResult.error(
                "protocol",
                f"Error: the worker's result for '{tool}' is not a toolfleet result "
                f"({exc.error_count()} error(s)).\n Please fix your mistakes.",
            )
    if state == "REVOKED":
        return ToolResult.error(
            "cancelled", f"Error: the call to '{tool}' was cancelled before it finished."
        )
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
        return ToolResult.error(
            "unknown_tool",
            f"Error: {tool} is not a valid tool: the worker that received the call does not "
            "serve it.\n Please fix your mistakes.",
        )
    if exc_type in ("UnreadableCall", "ContentDisallowed", "DecodeError"):
        return ToolResult.error(
            "protocol",
            f"Error: the worker could not read the call to '{tool}': {detail}\n"
            " Please fix your mistakes.",
        )
    if exc_type == "WorkerLostError":
        return ToolResult.error(
            "worker_lost",
            f"Error: the worker running '{tool}' stopped ({detail}) and the call could not be "
            "run again.\n Please fix your mistakes.",
        )
    return ToolResult.error("tool_error", error_text(_Remote(exc_type, detail)))


class _Remote(Exception):
    """An exception that happened on a worker, shown with its original type name."""

    def __init__(self, type_name: str, detail: str) -> None:
        super().__init__(detail)
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"{self.type_name}({str(self)!r})"
