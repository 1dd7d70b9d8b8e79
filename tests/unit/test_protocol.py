"""The wire contract: task naming, call identity and the frozen request/result models."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from tool_workers.contract.models import (
    LATER_REQUEST_FIELDS,
    MAX_ID_CHARS,
    PROTOCOL_VERSION,
    ToolRequest,
    ToolResult,
    TraceContext,
)
from tool_workers.contract.names import (
    TASK_PREFIX,
    call_key,
    task_id_for,
    task_name,
    tool_from_task,
)


def request(**overrides: object) -> ToolRequest:
    fields: dict[str, object] = {
        "tool": "echo",
        "call_id": "call_0",
        "args": {"text": "hi", "n": [1, 2]},
        "idempotency_key": "k-1",
        "thread_id": "t-1",
        "run_id": "r-1",
    }
    return ToolRequest.model_validate({**fields, **overrides})


# --- task names -------------------------------------------------------------------------


def test_given_tool_name_when_task_named_then_prefixed_and_reversible() -> None:
    assert task_name("read_file") == "tools.read_file"
    assert task_name("read_file").startswith(TASK_PREFIX)
    assert tool_from_task(task_name("read_file")) == "read_file"


@pytest.mark.parametrize("name", ["celery.backend_cleanup", "read_file", "toolsX.echo", ""])
def test_given_foreign_task_name_when_tool_looked_up_then_none(name: str) -> None:
    assert tool_from_task(name) is None


# --- call identity ----------------------------------------------------------------------


def test_given_same_call_when_task_id_derived_twice_then_same_uuid() -> None:
    key = call_key("thread-1", "msg-1", "call_0")
    first, second = task_id_for(key), task_id_for(call_key("thread-1", "msg-1", "call_0"))
    assert first == second
    assert uuid.UUID(first).version == 5


@pytest.mark.parametrize(
    "other",
    [
        ("thread-2", "msg-1", "call_0"),  # another thread
        ("thread-1", "msg-2", "call_0"),  # another turn reusing the provider's short call id
        ("thread-1", "msg-1", "call_1"),  # another call of the same AIMessage
        (None, "msg-1", "call_0"),
        ("thread-1", None, "call_0"),
    ],
)
def test_given_calls_differing_in_one_part_when_task_ids_derived_then_distinct(
    other: tuple[str | None, str | None, str],
) -> None:
    assert task_id_for(call_key(*other)) != task_id_for(call_key("thread-1", "msg-1", "call_0"))


def test_given_call_key_then_it_holds_thread_message_and_call_id() -> None:
    key = call_key("thread-1", "msg-1", "call_0")
    assert "thread-1" in key and "msg-1" in key and key.endswith("call_0")


# --- ToolRequest ------------------------------------------------------------------------


def test_given_request_without_version_then_current_protocol_version() -> None:
    assert request().protocol_version == PROTOCOL_VERSION == 1


def test_given_request_when_json_round_tripped_then_equal() -> None:
    original = request()
    wire = json.loads(original.model_dump_json())
    assert ToolRequest.model_validate(wire) == original
    assert wire["protocol_version"] == PROTOCOL_VERSION


def test_given_request_when_field_assigned_then_refused() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        request().tool = "other"


def test_given_unknown_field_when_request_validated_then_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        request(sneaky=True)


@pytest.mark.parametrize("missing", ["tool", "call_id", "idempotency_key"])
def test_given_request_missing_required_field_then_refused(missing: str) -> None:
    fields = request().model_dump()
    del fields[missing]
    with pytest.raises(ValidationError, match=missing):
        ToolRequest.model_validate(fields)


# --- ToolResult -------------------------------------------------------------------------


def test_given_result_with_blocks_and_artifact_when_json_round_tripped_then_equal() -> None:
    original = ToolResult(
        content=[{"type": "text", "text": "hi"}],
        artifact={"rows": [1, 2]},
        worker="w1@host",
        pid=42,
        started_at=1.5,
        duration=0.25,
    )
    assert ToolResult.model_validate_json(original.model_dump_json()) == original
    assert original.status == "success" and original.error_kind is None


def test_given_result_when_field_assigned_then_refused() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        ToolResult().status = "error"


def test_given_error_kind_and_message_when_error_built_then_error_status_and_extra_fields() -> None:
    result = ToolResult.error("timeout", "Error: too slow", worker="w1", duration=2.0)
    assert result.status == "error"
    assert result.error_kind == "timeout"
    assert result.content == "Error: too slow"
    assert (result.worker, result.duration) == ("w1", 2.0)
    assert result.protocol_version == PROTOCOL_VERSION


def test_given_unknown_error_kind_when_error_built_then_refused() -> None:
    with pytest.raises(ValidationError):
        ToolResult.error("nonsense", "x")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["tool", "call_id", "idempotency_key", "thread_id", "run_id"])
def test_a_worker_refuses_an_overlong_id(field: str) -> None:
    """Given a request with an id one character over the limit, when a worker reads it,
    then it is refused naming the field; at the limit, and when built by a sender, it is
    accepted (the worker answers the sender with an error result)."""
    wire = request().model_dump(mode="json")

    with pytest.raises(ValidationError) as refused:
        ToolRequest.from_wire({**wire, field: "x" * (MAX_ID_CHARS + 1)})

    assert refused.value.errors()[0]["loc"] == (field,)
    assert ToolRequest.from_wire({**wire, field: "x" * MAX_ID_CHARS})
    assert ToolRequest.model_validate({**wire, field: "x" * (MAX_ID_CHARS + 1)})


def _previous_request_model() -> type[BaseModel]:
    """ToolRequest as workers built before the later fields validate it (extra forbidden)."""
    fields: dict[str, Any] = {
        name: (info.annotation, info)
        for name, info in ToolRequest.model_fields.items()
        if name not in LATER_REQUEST_FIELDS
    }
    return create_model(
        "PreviousToolRequest", __config__=ConfigDict(frozen=True, extra="forbid"), **fields
    )


def test_given_untraced_request_when_put_on_the_wire_then_a_previous_worker_accepts_it() -> None:
    """Given a request without a trace context, then its wire form leaves ``trace`` out,
    so a worker of the same protocol version built before the field accepts it; a traced
    one carries it (and such a worker refuses it, which is why workers upgrade first)."""
    previous = _previous_request_model()
    plain = request().to_wire()
    assert "trace" not in plain
    assert previous.model_validate(plain).model_dump(mode="json", exclude_none=True) == plain
    assert ToolRequest.from_wire(plain) == request()

    traced = request(trace=TraceContext(langsmith_trace="20240101T000000000000Z1f0c")).to_wire()
    assert traced["trace"]["langsmith_trace"] == "20240101T000000000000Z1f0c"
    assert traced["protocol_version"] == PROTOCOL_VERSION
    with pytest.raises(ValidationError, match="extra"):
        previous.model_validate(traced)
