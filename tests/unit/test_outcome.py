"""What the result backend holds for a call, turned into the ToolResult the model reads."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.dispatch.outcome import result_from_meta
from tool_workers.contract.models import ToolResult, ToolSpec

SPEC = ToolSpec(name="grep", options={"time_limit": 30.0})


def failure(exc_type: str, *message: Any) -> dict[str, Any]:
    return {"status": "FAILURE", "result": {"exc_type": exc_type, "exc_message": list(message)}}


def test_given_success_with_a_toolfleet_result_then_that_result() -> None:
    sent = ToolResult(content="3 matches", worker="w1", pid=7, duration=0.5)
    meta = {"status": "SUCCESS", "result": sent.model_dump(mode="json")}

    assert result_from_meta(meta, "grep") == sent


def test_given_success_whose_payload_is_not_a_result_then_protocol_error() -> None:
    result = result_from_meta({"status": "SUCCESS", "result": {"unexpected": 1}}, "grep")

    assert (result.status, result.error_kind) == ("error", "protocol")
    assert "is not a toolfleet result" in str(result.content)


def test_given_revoked_then_cancelled_error() -> None:
    result = result_from_meta({"status": "REVOKED", "result": None}, "grep")

    assert result.error_kind == "cancelled"
    assert result.content == "Error: the call to 'grep' was cancelled before it finished."


def test_given_hard_time_limit_then_timeout_naming_the_policy_limit() -> None:
    result = result_from_meta(failure("TimeLimitExceeded", "31.0"), "grep", SPEC)

    assert result.error_kind == "timeout"
    assert "within its time limit of 30 s" in str(result.content)


def test_given_hard_time_limit_without_spec_then_the_limit_celery_reported() -> None:
    result = result_from_meta(failure("TimeLimitExceeded", "12.5"), "grep")

    assert "within its time limit of 12.5 s" in str(result.content)


def test_given_hard_time_limit_with_unreadable_detail_then_limit_unnamed() -> None:
    result = result_from_meta(failure("TimeLimitExceeded", "soon"), "grep")

    assert "did not finish within its time limit and" in str(result.content)


def test_given_not_registered_then_unknown_tool() -> None:
    result = result_from_meta(failure("NotRegistered", "tools.grep"), "grep")

    assert result.error_kind == "unknown_tool"
    assert "does not serve it" in str(result.content)


@pytest.mark.parametrize("exc_type", ["UnreadableCall", "ContentDisallowed", "DecodeError"])
def test_given_unreadable_message_then_protocol_error_with_detail(exc_type: str) -> None:
    result = result_from_meta(failure(exc_type, "bad body"), "grep")

    assert result.error_kind == "protocol"
    assert "could not read the call to 'grep': bad body" in str(result.content)


def test_given_worker_lost_then_worker_lost_error() -> None:
    result = result_from_meta(failure("WorkerLostError", "signal 9"), "grep")

    assert result.error_kind == "worker_lost"
    assert "stopped (signal 9)" in str(result.content)


def test_given_worker_lost_then_the_text_says_it_may_have_run_and_was_not_rerun() -> None:
    result = result_from_meta(failure("WorkerLostError", "signal 9"), "grep")

    assert "may have run" in str(result.content)
    assert "not run again" in str(result.content)
    assert "fix your mistakes" not in str(result.content)  # nothing the model did wrong


@pytest.mark.parametrize(
    ("exc_type", "exc_module"),
    [
        ("ConnectionError", "redis.exceptions"),
        ("TimeoutError", "redis.exceptions"),
        ("OperationalError", "kombu.exceptions"),
        ("BackendStoreError", "celery.exceptions"),
        ("ConnectionResetError", "builtins"),
    ],
)
def test_given_a_link_failure_record_then_the_result_could_not_be_delivered(
    exc_type: str, exc_module: str
) -> None:
    """A worker that could not store a finished call's result (its link to Redis cut for
    too long) leaves a failure record with the connection error: the model reads that
    the result was lost on the way, that the tool may have run, and that it was not
    retried, never a bare connection error that invites calling again."""
    meta = failure(exc_type, "Timeout reading from socket")
    meta["result"]["exc_module"] = exc_module

    result = result_from_meta(meta, "pay", SPEC)

    assert result.error_kind == "worker_lost"
    assert "lost its connection to Redis" in str(result.content)
    assert "could not deliver the call's result" in str(result.content)
    assert "may have run" in str(result.content)
    assert "not retried" in str(result.content)
    assert not str(result.content).startswith(f"Error: {exc_type}(")


def test_given_a_soft_time_limit_failure_record_then_a_timeout_naming_the_limit() -> None:
    spec = ToolSpec(name="grep", options={"time_limit": 30.0, "soft_time_limit": 6.0})

    result = result_from_meta(failure("SoftTimeLimitExceeded", ""), "grep", spec)

    assert result.error_kind == "timeout"
    assert "did not finish within its time limit of 6 s" in str(result.content)
    assert "SoftTimeLimitExceeded" not in str(result.content)


def test_given_other_failure_then_tool_error_with_its_type_name() -> None:
    result = result_from_meta(failure("OSError", "disk full"), "grep")

    assert result.error_kind == "tool_error"
    assert result.content == "Error: OSError('disk full')\n Please fix your mistakes."


@pytest.mark.parametrize("payload", [None, "text", ["list"], {"exc_message": "one string"}])
def test_given_failure_with_odd_payload_then_still_a_tool_error(payload: Any) -> None:
    result = result_from_meta({"status": "FAILURE", "result": payload}, "grep")

    assert (result.status, result.error_kind) == ("error", "tool_error")
