"""OpenTelemetry spans in the form the tracing tests compare them, whichever process
ended them (the orchestrator's in-memory exporter, the worker's file exporter)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def describe(span: ReadableSpan) -> dict[str, Any]:
    """A span's name, ids (hex), kind, attributes and status."""
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
