"""What Flower and the worker log show of a call: its arguments masked, its identity, and
how it ended, never its result.

The orchestrator publishes every call with ``kwargsrepr="(<tool> call=<tool_call_id>
thread=<thread id> queue=<queue>)"``: Flower's kwargs column names the call. Its args
column shows the call's arguments as :func:`args_summary` gives them (masked by
:mod:`tool_workers.contract.masking`, long values cut, the whole at most
:data:`ARGS_CHARS`): :class:`ToolCallRequest` (the tool tasks' Celery ``Request`` class)
computes it where Celery logs ``Received task`` and sends ``task-received``.

Workers answering ``inspect active``/``reserved``/``scheduled`` (Flower asks these for
a worker's page, ``toolfleet status`` for in-flight calls) would list the raw arguments
unless asked with ``safe=True``: :class:`ToolCallRequest` always answers with the
summaries.

Results need two more stops, because Celery prints ``repr(result)`` (up to the task's
``resultrepr_maxsize``, 1024 characters) in two places: the pool's "Task ... succeeded
in ...: <result>" log line, and the ``result`` field of the ``task-succeeded`` event
that Flower stores and shows. :class:`ToolCallRequest` replaces the event's result with
:func:`result_summary`, and :class:`SucceededLineFilter` does the same for the log line.
Celery would still compute the whole repr first, for each call: a tool task returns a
:class:`ToolTaskResult`, whose repr for Celery is its status alone
(:func:`short_result_repr`).
A call that ended in an error result is a failed task
(:mod:`tool_workers.contract.failed`): Flower shows its exception, a short line.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from celery.app import trace
from celery.worker.request import Request

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.fence import HOLDING_HEADER, holding_in
from tool_workers.compat import celery as celery_compat
from tool_workers.contract.masking import MASK, mask_value
from tool_workers.contract.masking import SECRET_NAMES as SECRET_FIELDS
from tool_workers.contract.names import TASK_PREFIX
from tool_workers.observability import metrics

_STATUS = re.compile(r"'status': '(\w+)'")

_RECEIVED_LOG = logging.getLogger("celery.worker.strategy")
"""Where Celery writes its "Received task" line (at INFO)."""

ARGS_CHARS = 40
"""Characters of a call's arguments Flower's args column and the worker log show (the
Tasks page's default columns fit a 1,600 px screen with it)."""

VALUE_CHARS = 24
"""Characters of one string argument shown before it is cut."""

__all__ = [
    "ARGS_CHARS",
    "MASK",
    "SECRET_FIELDS",
    "VALUE_CHARS",
    "SucceededLineFilter",
    "ToolCallRequest",
    "ToolTaskResult",
    "args_summary",
    "quiet_celery_trace",
    "result_summary",
    "short_result_repr",
]


def _cut(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if isinstance(value, str) and len(value) > VALUE_CHARS:
        return value[: VALUE_CHARS - 3] + "..."
    return value


def args_summary(args: Any) -> str:
    """A tool call's arguments as Flower and the log show them: ``(path='a.txt', n=3)``.

    Values of secret-named fields (:data:`SECRET_FIELDS`, at any depth) are ``***``,
    passwords in URLs masked, strings cut at :data:`VALUE_CHARS`, the whole at
    :data:`ARGS_CHARS`.

    Args:
        args: The call's arguments (the request's ``args``), a dict from the wire.
    """
    if not isinstance(args, dict):
        return "(?)"
    shown = _cut(mask_value(args))
    line = "(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"
    return line if len(line) <= ARGS_CHARS else line[: ARGS_CHARS - 4] + "...)"


def result_summary(result_repr: Any) -> str:
    """What may be shown of a tool task's result: its status, e.g. ``<success>``.

    Args:
        result_repr: Celery's ``saferepr`` of the task's return value, a ToolResult dict
            whose ``status`` key comes second, right after ``protocol_version``.
    """
    match = _STATUS.search(str(result_repr)[:200])
    return f"<{match.group(1) if match else 'result'}>"


class ToolTaskResult(dict[str, Any]):
    """What a tool task returns: its result's wire form, a plain dict to whatever reads
    it (the result store, signal receivers, an eager call's caller)."""


def _status_repr(result: ToolTaskResult) -> str:
    return f"{{'status': {result.get('status')!r}}}"


def short_result_repr() -> None:
    """Have Celery's tracer write a tool task's result repr as its status alone, e.g.
    ``{'status': 'success'}``: what :func:`result_summary` keeps of it."""
    celery_compat.short_result_repr(ToolTaskResult, _status_repr)


class ToolCallRequest(Request):  # type: ignore[misc]
    """Celery's task request, showing masked arguments and a result summary, never the
    payload.

    It also counts, for the worker's metrics, the calls whose pool process could not
    report how they ended (hard time limit, process lost).
    """

    _shown_args: str | None = None

    @property
    def argsrepr(self) -> str:
        """The call's arguments, masked and cut (:func:`args_summary`), for Celery's
        "Received task" line and ``task-received`` event; ``""`` when neither goes out
        (Celery's strategy asks on every delivery, and a worker's dispatcher is on for
        its heartbeats even when it drops task events)."""
        eventer = getattr(self, "eventer", None)
        if (
            eventer is not None
            and eventer.enabled
            and (not eventer.groups or "task" in eventer.groups)
        ) or _RECEIVED_LOG.isEnabledFor(logging.INFO):
            return self.shown_args()
        return ""

    def shown_args(self) -> str:
        """The call's arguments, masked and cut (:func:`args_summary`)."""
        if self._shown_args is None:
            body = self.args
            request = body[0] if isinstance(body, (list, tuple)) and body else None
            self._shown_args = args_summary(
                request.get("args") if isinstance(request, dict) else None
            )
        return self._shown_args

    def info(self, safe: bool = False) -> dict[str, Any]:
        # What inspect replies carry: the summaries whoever asks.
        info = dict(super().info(safe=True))
        info["args"] = self.shown_args()
        return info

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

    def acknowledge(self) -> None:
        first = not self.acknowledged
        super().acknowledge()
        if first:
            self._release()

    def reject(self, requeue: bool = False) -> None:
        first = not self.acknowledged
        super().reject(requeue=requeue)
        if first:
            self._release()

    def _release(self) -> None:
        # RabbitMQ: the delivery is no longer held under the worker's lease
        # (tool_workers.celery_ext.amqp_lease); on Redis the transport's QoS did it. Only
        # when this request's own acknowledgement or rejection happened, as Celery's
        # guard: Celery may ask again later (a lost pool process).
        lease = leases.current()
        if lease is not None:
            lease.release(holding_in(self.request_dict.get(HOLDING_HEADER)))

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
