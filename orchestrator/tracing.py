"""The orchestrator's side of a remote call's trace: what crosses the wire with it.

Each remote call carries a :class:`~tool_workers.contract.TraceContext` built where the
call is made (in the Send task's thread, or in its coroutine: an async call is published
from another thread, which holds no context of the caller's):

- LangSmith: ``langsmith-trace`` and ``baggage`` of the call's own tool run, the one
  :mod:`orchestrator.observe` reports (``RunTree.to_headers()`` of the run the
  ``LangChainTracer`` among the run's handlers keeps for it). On the worker the tool's
  body runs as that run (see :mod:`tool_workers.observability.trace_parent`), so what it
  traces nests under it.
- OpenTelemetry (with ``opentelemetry-api`` installed, ``toolfleet[otel]``): the call
  runs inside a span ``dispatch_tool <tool>`` (kind PRODUCER, from the tool run's start
  to the result), current when ``propagate.inject`` writes ``traceparent`` and
  ``tracestate``, so the worker's ``execute_tool <tool>`` span is its child. Its
  attributes are the worker span's: ``toolfleet.tool``, ``toolfleet.tool_call_id``,
  ``toolfleet.thread_id``, ``toolfleet.run_id``, ``toolfleet.task_id``,
  ``toolfleet.attempt``, then ``toolfleet.worker`` and ``toolfleet.outcome`` when the
  result is in, plus ``gen_ai.tool.name`` and ``gen_ai.tool.call.id``; never the
  arguments or the result.

``opentelemetry-instrumentation-celery`` on the workers takes its parent from the task
message's headers, so the W3C headers also travel there (:func:`message_headers`), and
the message is published with the call's context attached (:func:`publishing`). With
the instrumentation on the orchestrator as well, its publish span
(``apply_async/tools.<tool>``) is a child of the dispatch span and its own
``traceparent`` replaces the dispatch span's in the headers. Either way the trace is
one: dispatch span, (publish span,) the instrumentation's task span, toolfleet's
``execute_tool`` span.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import langsmith
from langchain_core.callbacks.base import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langsmith import utils as ls_utils
from pydantic import ValidationError

from orchestrator.call import PreparedCall
from orchestrator.compat.langsmith import current_aio_to_thread
from tool_workers.contract.errors import RunDeadlineExceeded
from tool_workers.contract.models import ToolResult, TraceContext, span_attributes

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("toolfleet.orchestrator")

SPAN_PREFIX = "dispatch_tool "
"""The orchestrator's span of a call is named ``dispatch_tool <tool>``."""

W3C_HEADERS = ("traceparent", "tracestate")


def langsmith_headers(run_id: Any, handlers: list[BaseCallbackHandler]) -> dict[str, str]:
    """LangSmith's propagation headers of the tool run ``run_id`` (empty when untraced)."""
    from langchain_core.tracers.langchain import LangChainTracer

    for handler in handlers:
        if not isinstance(handler, LangChainTracer):
            continue
        tree = handler.run_map.get(str(run_id))
        if tree is not None and tree.dotted_order and not tree.extra.get("__disabled"):
            return tree.to_headers()
    return {}


@functools.cache
def _otel() -> Any:
    """The ``opentelemetry`` package with its trace, context and propagation APIs, or
    ``None`` without the ``otel`` extra. Looked up once: every call asks, and a failed
    import is not cached by Python (it searches the import path again each time)."""
    try:
        import opentelemetry.context
        import opentelemetry.propagate
        import opentelemetry.trace
    except ImportError:
        return None
    # Its runtime context is loaded from the package's entry points at first use (before
    # opentelemetry-api 1.22 or so): here, not in a running event loop.
    opentelemetry.context.get_current()
    return opentelemetry


# Looked up as this module loads, not at a call's first span: importing the propagators
# and loading the runtime context read the package's metadata from disk, which would
# block a running event loop (an async run's first call).
_otel()


def _otel_headers() -> dict[str, str]:
    otel = _otel()
    if otel is None:
        return {}
    carrier: dict[str, str] = {}
    otel.propagate.inject(carrier)
    return carrier


def trace_context(run_id: Any, handlers: list[BaseCallbackHandler]) -> TraceContext | None:
    """The context a call carries: its LangSmith tool run's and the current span's.

    Taken in the caller's thread or coroutine. ``None`` when neither is traced.
    """
    headers = langsmith_headers(run_id, handlers)
    for name, value in _otel_headers().items():
        if name == "baggage" and headers.get("baggage"):
            # One header, two writers: W3C Baggage entries after LangSmith's own
            # (``langsmith-*`` keys); each side reads the entries it knows.
            headers["baggage"] = f"{headers['baggage']},{value}"
        else:
            headers[name] = value
    try:
        return TraceContext.from_headers(headers)
    except ValidationError:
        # An oversized baggage (a run's metadata) must not cost the trace itself.
        log.warning("trace context too large; sent without its baggage")
        headers.pop("baggage", None)
        try:
            return TraceContext.from_headers(headers)
        except ValidationError:
            return None


def message_headers(trace: TraceContext | None) -> dict[str, str]:
    """The W3C headers of ``trace`` for the Celery message (its instrumentation reads them)."""
    if trace is None:
        return {}
    return {k: v for k, v in trace.headers().items() if k in W3C_HEADERS}


@contextlib.contextmanager
def publishing(trace: TraceContext | None) -> Iterator[None]:
    """The call's OpenTelemetry context attached while its message is published.

    The publishing thread is not the caller's; an instrumented publish (Celery's
    ``before_task_publish``) then starts its span under the call's dispatch span.
    """
    otel = _otel()
    if trace is None or trace.traceparent is None or otel is None:
        yield
        return
    token = otel.context.attach(otel.propagate.extract(trace.headers()))
    try:
        yield
    finally:
        otel.context.detach(token)


class DispatchSpan:
    """The orchestrator's span of one call (a no-op without OpenTelemetry)."""

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def finished(self, output: Any) -> None:
        """Record the call's outcome (and the worker that ran it) from its ToolMessage."""
        meta = output.response_metadata.get("toolfleet") if isinstance(output, ToolMessage) else {}
        meta = meta or {}
        self._record(meta.get("error_kind"), meta.get("worker"), meta.get("task_id"))

    def finished_with(self, result: ToolResult) -> None:
        """Record the call's outcome from its result (a tool invoked directly)."""
        self._record(result.error_kind, result.worker, None)

    def _record(self, error_kind: Any, worker: Any, task_id: Any) -> None:
        if self._span is None:
            return
        outcome = str(error_kind or "success")
        self._span.set_attributes(
            span_attributes(
                {
                    # An edited or retried call ends under a task id of its own.
                    "toolfleet.task_id": task_id,
                    "toolfleet.worker": worker,
                    "toolfleet.outcome": outcome,
                }
            )
        )
        if outcome != "success":
            self._set_error(outcome)

    def failed(self, exc: BaseException) -> None:
        """Record a call that ended with an exception (a deadline, a cancellation)."""
        if self._span is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            outcome = "cancelled"
        elif isinstance(exc, RunDeadlineExceeded):
            outcome = "deadline"
        else:
            outcome = "failure"
        self._span.set_attribute("toolfleet.outcome", outcome)
        self._set_error(outcome)

    def _set_error(self, description: str) -> None:
        assert self._span is not None
        trace = _otel().trace
        self._span.set_status(trace.Status(trace.StatusCode.ERROR, description))


@contextlib.contextmanager
def dispatch_span(call: PreparedCall) -> Iterator[DispatchSpan]:
    """A current span ``dispatch_tool <tool>`` around a remote call, when OpenTelemetry
    is installed; what records its outcome (an exception leaving the block records its
    own: ``deadline``, ``cancelled`` or ``failure``)."""
    otel = _otel()
    if otel is None or isinstance(otel.trace.get_tracer_provider(), otel.trace.ProxyTracerProvider):
        # No OpenTelemetry, or no tracer provider set up in this process: every span would
        # be a no-op.
        yield DispatchSpan(None)
        return
    trace = otel.trace
    tracer = trace.get_tracer("toolfleet.orchestrator")
    attributes = span_attributes(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "gen_ai.tool.call.id": call.call_id,
            "toolfleet.tool": call.tool,
            "toolfleet.tool_call_id": call.call_id,
            "toolfleet.thread_id": call.thread_id,
            "toolfleet.run_id": call.run_id,
            "toolfleet.task_id": call.task_id,
            "toolfleet.attempt": call.attempt + 1,
        }
    )
    with tracer.start_as_current_span(
        f"{SPAN_PREFIX}{call.tool}",
        kind=trace.SpanKind.PRODUCER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        recorder = DispatchSpan(span)
        try:
            yield recorder
        except BaseException as exc:
            recorder.failed(exc)
            raise


async def _steps_inline_when_untraced(
    previous: Any, default: Any, ctx: Any, func: Any, /, *args: Any, **kwargs: Any
) -> Any:
    """langsmith's ``aio_to_thread`` with an untraced step run on the loop: a step whose
    context LangSmith does not trace creates no run and writes nothing, so the two
    thread hops each traced hook costs by default buy nothing. A traced step goes to
    the override that was in place (``previous``), or to langsmith's default."""
    if not ctx.run(ls_utils.tracing_is_enabled):
        return ctx.run(func, *args, **kwargs)
    if previous is not None:
        return await previous(default, ctx, func, *args, **kwargs)
    return await default(ctx, func, *args, **kwargs)


_INLINE_LOCK = threading.Lock()


def untraced_steps_inline() -> None:
    """Have LangSmith's ``traceable`` set up and end an untraced run on the event loop.

    ``create_agent`` wraps each middleware's async hooks in ``traceable``, which runs its
    setup and its end in the loop's default executor: two thread hops per hook call,
    traced or not (about 0.7 ms of an async call's added latency on 2 cores). Installed
    through langsmith's public ``set_runtime_overrides`` once per process (again is a
    no-op), wrapping any override already in place, which still decides for traced
    steps. A traced run is set up and ended as before (langsmith then re-enters its
    context with ``tracing_context`` instead of a task of its own, its documented path
    for overrides).
    """
    install = getattr(langsmith, "set_runtime_overrides", None)
    if install is None:  # a langsmith without runtime overrides: nothing to wrap
        return
    with _INLINE_LOCK:
        current = current_aio_to_thread()
        if isinstance(current, functools.partial) and current.func is _steps_inline_when_untraced:
            return
        install(aio_to_thread=functools.partial(_steps_inline_when_untraced, current))
