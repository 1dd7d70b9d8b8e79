"""A tool module that sets up OpenTelemetry's SDK in the worker, for the tracing tests.

Every finished span is appended as one JSON line to ``TOOLFLEET_TEST_SPANS``, written by
whichever process ended it (the pool processes inherit the provider).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from langchain_core.tools import tool
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


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


def describe(span: ReadableSpan) -> dict[str, object]:
    """A span as the tests compare it: names, ids, attributes and status."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["TOOLFLEET_TEST_SPANS"])))
trace.set_tracer_provider(_provider)


@tool
def traced_step(label: str) -> str:
    """Does one step inside a span of its own."""
    with trace.get_tracer("tests.otel_worker").start_as_current_span(f"inner {label}"):
        return f"stepped {label}"
