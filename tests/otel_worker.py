"""A tool module that sets up OpenTelemetry's SDK in the worker, for the tracing tests.

Every finished span is appended as one JSON line to ``TOOLFLEET_TEST_SPANS``, written by
whichever process ended it (the pool processes inherit the provider). With
``TOOLFLEET_TEST_CELERY_OTEL`` set, ``opentelemetry-instrumentation-celery`` traces the
worker's tasks too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from langchain_core.tools import tool
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.support.spans import describe


class FileExporter(SpanExporter):
    """Appends each span as a JSON line (ids in hex) to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(describe(span)) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["TOOLFLEET_TEST_SPANS"])))
trace.set_tracer_provider(_provider)

if os.environ.get("TOOLFLEET_TEST_CELERY_OTEL"):
    # The user's Celery instrumentation as well: its task span becomes toolfleet's parent.
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument(tracer_provider=_provider)


@tool
def traced_step(label: str) -> str:
    """Does one step inside a span of its own."""
    with trace.get_tracer("tests.otel_worker").start_as_current_span(f"inner {label}"):
        return f"stepped {label}"
