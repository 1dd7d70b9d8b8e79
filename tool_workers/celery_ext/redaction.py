"""Flower and the worker log show which call ran and how it ended, never its payload.

Arguments are kept out at the source: the orchestrator publishes every call with
``argsrepr="(<tool> call=<tool_call_id> thread=<thread id>)"`` and ``kwargsrepr="{}"``,
which is what Celery logs and sends in ``task-received`` events (and what Flower shows
as args/kwargs).

Workers answering ``inspect active``/``reserved``/``scheduled`` (Flower asks these for
a worker's page, ``toolfleet status`` for in-flight calls) would list the real
arguments unless asked with ``safe=True``: :class:`ToolCallRequest` always answers with
the argsrepr.

Results need two more stops, because Celery prints ``repr(result)`` (up to the task's
``resultrepr_maxsize``, 1024 characters) in two places: the pool's "Task ... succeeded
in ...: <result>" log line, and the ``result`` field of the ``task-succeeded`` event
that Flower stores and shows. :class:`ToolCallRequest` (the tool tasks' Celery
``Request`` class) replaces the event's result with :func:`result_summary`, and
:class:`SucceededLineFilter` does the same for the log line.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from celery.app import trace
from celery.worker.request import Request

from tool_workers.compat import celery as celery_compat
from tool_workers.contract.names import TASK_PREFIX
from tool_workers.observability import metrics

_STATUS = re.compile(r"'status': '(\w+)'")


def result_summary(result_repr: Any) -> str:
    """What may be shown of a tool task's result: its status, e.g. ``<success>``.

    Args:
        result_repr: Celery's ``saferepr`` of the task's return value, a ToolResult dict
            whose ``status`` key comes second, right after ``protocol_version``.
    """
    match = _STATUS.search(str(result_repr)[:200])
    return f"<{match.group(1) if match else 'result'}>"


class ToolCallRequest(Request):  # type: ignore[misc]
    """Celery's task request, showing argsrepr and a result summary, never the payload.

    It also counts, for the worker's metrics, the calls whose pool process could not
    report how they ended (hard time limit, process lost).
    """

    def info(self, safe: bool = False) -> dict[str, Any]:
        # What inspect replies carry: the argsrepr whoever asks.
        return dict(super().info(safe=True))

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        # Checked before Celery's handling, which marks the call cancelled or revoked.
        outcome = None
        if metrics.active() is not None:
            outcome = metrics.failure_outcome(
                exc_info.exception, celery_compat.ended_by_worker(self)
            )
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        active = metrics.active()
        if outcome is not None and active is not None:
            # Pool process gone: only the main process can count this call.
            active.unreported(self.name, self.hostname or "", outcome, self.time_start)

    def send_event(self, type: str, **fields: Any) -> None:
        if type == "task-succeeded" and "result" in fields:
            fields["result"] = result_summary(fields["result"])
        super().send_event(type, **fields)


class SucceededLineFilter(logging.Filter):
    """Replaces the result in Celery's "Task tools.<name>[id] succeeded in ..." log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.msg == trace.LOG_SUCCESS
            and isinstance(args, dict)
            and str(args.get("name", "")).startswith(TASK_PREFIX)
        ):
            record.args = {**args, "return_value": result_summary(args.get("return_value"))}
        return True


def quiet_celery_trace() -> None:
    """Install :class:`SucceededLineFilter` on Celery's trace logger (once)."""
    if not any(isinstance(f, SucceededLineFilter) for f in trace.logger.filters):
        trace.logger.addFilter(SucceededLineFilter())
