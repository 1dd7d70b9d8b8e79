"""An OpenTelemetry span for each call a worker runs, in the caller's trace.

With ``opentelemetry-api`` installed (``pip install 'toolfleet[otel]'``) and a tracer
provider configured in the worker (the OpenTelemetry SDK, e.g. ``opentelemetry-instrument
celery -A tool_workers worker ...`` or a tool module that sets one up), every call runs
inside a span ``execute_tool <tool>``:

- its parent is the W3C ``traceparent``/``tracestate`` the request's
  :class:`~tool_workers.contract.TraceContext` carries (a call without one starts a
  trace), or the span current when the task starts, when one is (the span of
  ``opentelemetry-instrumentation-celery``, itself a child of the same caller);
- the span is current while the tool runs, so what the tool traces nests under it;
- attributes: ``toolfleet.tool``, ``toolfleet.tool_call_id``, ``toolfleet.thread_id``,
  ``toolfleet.run_id``, ``toolfleet.task_id``, ``toolfleet.worker``, ``toolfleet.attempt``
  and ``toolfleet.outcome`` (as in the logs and metrics), plus GenAI's
  ``gen_ai.operation.name``, ``gen_ai.tool.name`` and ``gen_ai.tool.call.id``. Never the
  arguments or the result.

The span starts and ends with the task (Celery's ``task_prerun``/``task_postrun``, which
run in the thread that runs the task). A call whose pool process is killed (hard time
limit, crash) never ends its span.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import signals
from pydantic import ValidationError

from tool_workers.contract.models import TraceContext, span_attributes
from tool_workers.contract.names import tool_from_task
from tool_workers.observability.metrics import returned_outcome

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span

log = logging.getLogger("toolfleet.worker")

SPAN_PREFIX = "execute_tool "
"""A call's span is named ``execute_tool <tool>`` (OpenTelemetry's GenAI convention)."""

_open: dict[str, tuple[Span, Token[Context]]] = {}
"""Spans of the tasks running in this process, with their context tokens, by task id."""


def start() -> bool:
    """Trace every call this worker runs, when opentelemetry-api is installed.

    Returns:
        Whether calls are traced.
    """
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    signals.task_prerun.connect(_prerun, weak=False)
    signals.task_postrun.connect(_postrun, weak=False)
    return True


def trace_context_of(raw: Any) -> TraceContext | None:
    """The trace context of a raw request as received (``None`` if absent or malformed)."""
    fields = raw.get("trace") if isinstance(raw, dict) else None
    if not isinstance(fields, dict):
        return None
    try:
        return TraceContext.model_validate(fields)
    except ValidationError:
        return None


def _prerun(
    task_id: str = "", task: Any = None, args: Any = (), kwargs: Any = None, **_: Any
) -> None:
    tool = tool_from_task(str(task.name)) if task is not None else None
    if tool is None:
        return
    from opentelemetry import context, propagate, trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # no tracer provider set up in this process: every span would be a no-op
    raw = args[0] if args else (kwargs or {}).get("request")
    request = raw if isinstance(raw, dict) else {}
    if trace.get_current_span().get_span_context().is_valid:
        parent = context.get_current()
    else:
        carried = trace_context_of(raw)
        parent = propagate.extract(carried.headers() if carried else {})
    tracer = trace.get_tracer("toolfleet.worker")
    span = tracer.start_span(
        f"{SPAN_PREFIX}{tool}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=span_attributes(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": request.get("call_id"),
                "toolfleet.tool": tool,
                "toolfleet.tool_call_id": request.get("call_id"),
                "toolfleet.thread_id": request.get("thread_id"),
                "toolfleet.run_id": request.get("run_id"),
                "toolfleet.task_id": task_id,
                "toolfleet.worker": task.request.hostname,
                "toolfleet.attempt": int(task.request.retries or 0) + 1,
            }
        ),
    )
    token = context.attach(trace.set_span_in_context(span, parent))
    _open[task_id] = (span, token)


def _postrun(task_id: str = "", state: str | None = None, retval: Any = None, **_: Any) -> None:
    opened = _open.pop(task_id, None)
    if opened is None:
        return
    from opentelemetry import context, trace

    span, token = opened
    outcome = returned_outcome(state, retval)
    if outcome is None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "the pool process was stopped"))
    else:
        span.set_attribute("toolfleet.outcome", outcome)
        if outcome != "success":
            span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
    span.end()
    context.detach(token)
