"""Turn what the result backend holds for a call into a ToolResult.

A worker's own result carries content, artifact and status: a SUCCESS's result, or the
FAILURE of a call that ended in an error result, which carries it
(:mod:`tool_workers.contract.failed`). Celery records a failure itself when the call
never returned: the hard time limit killed it, no worker
knew the task, the worker was lost for good, or the call was revoked.

With a signing key, a worker's result counts only with a valid signature for the call's
task id. Celery's own failure records cannot be signed: they still say what happened
(time limit, lost worker), but the text they carry, which anyone who can write to Redis
could have chosen, is not shown to the model.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from orchestrator.messages import (
    bad_result_text,
    cancelled_text,
    not_served_text,
    not_served_there_text,
    refused_result_text,
    undelivered_text,
    unreadable_text,
    worker_lost_text,
)
from tool_workers.contract.failed import result_of_failure
from tool_workers.contract.models import ToolResult, ToolSpec, error_text, timeout_text
from tool_workers.contract.signing import result_problem

log = logging.getLogger("toolfleet.dispatch")

WITHHELD = "details not shown: unsigned"
"""The detail of a Celery failure record when a signing key is set."""

LINK_FAILURE_MODULES = ("redis.", "socket")
"""Modules whose every exception is a failed link (kombu's are matched by type name:
its ``EncodeError`` is not one)."""

LINK_FAILURES = frozenset(
    {
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "TimeoutError",
        "OperationalError",
        "BackendStoreError",
        "timeout",
    }
)
"""Exception types of a failure record that mean the worker's link failed, not the tool.

A tool's own exceptions never reach a failure record (the worker turns them into an
error result, carried by its own failure type), so a record carrying one of these says
the worker could not store the call's result: it ran, or may have, and its answer was
lost on the way.
"""


def result_from_meta(
    meta: dict[str, Any],
    tool: str,
    spec: ToolSpec | None = None,
    *,
    task_id: str = "",
    signing_key: str | None = None,
) -> ToolResult:
    """The ToolResult for a ready Celery meta of a call to ``tool``.

    Args:
        meta: What the result backend holds for the call.
        tool: The tool called.
        spec: The tool's spec (its time limit names a timeout).
        task_id: The call's task id, which a signed result must be signed for.
        signing_key: ``TOOLFLEET_SIGNING_KEY``: unsigned or mis-signed results are refused.
    """
    state = meta.get("status")
    payload = meta.get("result")
    if state == "FAILURE":
        # A call that ended in an error result is a failed task carrying that result
        # (tool_workers.contract.failed): read as a success's is.
        carried = result_of_failure(payload)
        if carried is not None:
            state, payload = "SUCCESS", carried
    if state == "SUCCESS":
        if signing_key:
            problem = result_problem(signing_key, task_id, payload)
            if problem is not None:
                log.error("refused the %s result of call %s to %s", problem, task_id, tool)
                return ToolResult.error("protocol", refused_result_text(tool, problem))
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
    if signing_key:
        detail = WITHHELD
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
    if exc_type == "NotServed":  # no live worker serves it (tool_workers.celery_ext.hand_on)
        return ToolResult.error("unknown_tool", not_served_text(tool, detail))
    if exc_type in ("UnreadableCall", "ContentDisallowed", "DecodeError"):
        return ToolResult.error("protocol", unreadable_text(tool, detail))
    if exc_type == "SoftTimeLimitExceeded":  # the soft limit, fired outside the tool
        limit = spec.options.get("soft_time_limit") if spec else None
        return ToolResult.error("timeout", timeout_text(tool, limit))
    if exc_type == "WorkerLostError":
        return ToolResult.error("worker_lost", worker_lost_text(tool, detail))
    exc_module = payload.get("exc_module", "") if isinstance(payload, dict) else ""
    if exc_type in LINK_FAILURES or str(exc_module).startswith(LINK_FAILURE_MODULES):
        return ToolResult.error("worker_lost", undelivered_text(tool, detail or exc_type))
    shown = "RemoteError" if signing_key else exc_type
    return ToolResult.error("tool_error", error_text(_Remote(shown, detail)))


class _Remote(Exception):
    """An exception that happened on a worker, shown with its original type name."""

    def __init__(self, type_name: str, detail: str) -> None:
        super().__init__(detail)
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"{self.type_name}({str(self)!r})"
