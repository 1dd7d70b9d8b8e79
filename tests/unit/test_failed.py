"""A call that ended in an error result is a failed Celery task carrying that result."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from celery import Celery
from celery.utils.saferepr import saferepr
from celery.utils.serialization import get_pickleable_exception

from orchestrator.dispatch.outcome import result_from_meta
from tool_workers.contract.failed import (
    SHOWN_CHARS,
    ToolCallFailed,
    ToolError,
    ToolRefused,
    ToolTimeout,
    failure_of,
    result_of_failure,
)
from tool_workers.contract.models import ToolResult, error_text, timeout_text
from tool_workers.contract.signing import sign_result
from tool_workers.observability.metrics import returned_outcome

KEY = "k" * 32
TASK_ID = "5dcccc79-573c-5b59-b9bc-26f4557a71ae"


def stored_failure(exc: BaseException) -> dict[str, Any]:
    """The FAILURE state Celery's JSON backend stores (and publishes) for ``exc``, as read
    back from Redis."""
    app = Celery("pin", set_as_current=False, backend="cache+memory://")
    meta = {"status": "FAILURE", "result": app.backend.prepare_exception(exc, "json")}
    return dict(json.loads(json.dumps(meta)))


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("tool_error", ToolError),
        ("invalid_args", ToolError),
        ("too_large", ToolError),
        ("timeout", ToolTimeout),
        ("hung", ToolTimeout),
        ("protocol", ToolRefused),
        ("redelivered", ToolRefused),
        ("cancelled", ToolRefused),
        ("worker_lost", ToolRefused),
    ],
)
def test_each_error_kind_fails_as_its_family(kind: str, cls: type[ToolCallFailed]) -> None:
    result = ToolResult.error(kind, "Error: it went wrong.\n Please fix your mistakes.")  # type: ignore[arg-type]

    exc = failure_of(result.to_wire())

    assert type(exc) is cls and isinstance(exc, ToolCallFailed)
    assert exc.result == result.to_wire()


def test_what_flower_shows_is_the_type_and_a_short_line() -> None:
    content = error_text(ZeroDivisionError("division by zero"))
    exc = failure_of(ToolResult.error("tool_error", content).to_wire())

    # Flower shows the task-failed event's exception: saferepr of the exception.
    assert saferepr(exc) == "ToolError(\"ZeroDivisionError('division by zero')\")"
    assert str(exc) == "ZeroDivisionError('division by zero')"
    refused = failure_of(ToolResult.error("redelivered", "Error: the call was lost.").to_wire())
    assert repr(refused) == "ToolRefused('redelivered: the call was lost.')"


def test_the_shown_line_masks_url_passwords_hides_schema_errors_and_is_cut() -> None:
    leaked = failure_of(
        ToolResult.error("tool_error", "Error: cannot reach redis://u:hunter2@db:6379").to_wire()
    )
    schema = failure_of(
        ToolResult.error(
            "invalid_args", "Error invoking tool 'x' with kwargs {'pw': 'p'}"
        ).to_wire()
    )
    long = failure_of(ToolResult.error("tool_error", "x" * 1000).to_wire())

    assert "hunter2" not in repr(leaked) and "redis://u:***@db" in str(leaked)
    assert str(schema) == "invalid_args: the arguments do not match the tool's schema"
    assert len(str(long)) == SHOWN_CHARS and str(long).endswith("...")


def test_the_exception_survives_celerys_json_and_pickle() -> None:
    wire = ToolResult.error("timeout", timeout_text("hang", 1.0), worker="w@h").to_wire()
    exc = failure_of(wire)
    app = Celery("pin", set_as_current=False, backend="cache+memory://")

    meta = stored_failure(exc)
    rebuilt = app.backend.exception_to_python(meta["result"])
    pickled = pickle.loads(pickle.dumps(exc))

    assert meta["result"]["exc_type"] == "ToolTimeout"
    assert meta["result"]["exc_module"] == "tool_workers.contract.failed"
    assert result_of_failure(meta["result"]) == wire
    assert type(rebuilt) is ToolTimeout and result_of_failure(rebuilt) == wire
    assert get_pickleable_exception(exc) is exc
    assert type(pickled) is ToolTimeout and pickled.result == wire


@pytest.mark.parametrize(
    "payload",
    [
        {"exc_type": "ToolError", "exc_module": "builtins", "exc_message": ["m", {}]},
        {"exc_type": "ValueError", "exc_module": "tool_workers.contract.failed"},
        {"exc_type": "ToolError", "exc_module": "tool_workers.contract.failed"},
        {"exc_type": "ToolError", "exc_module": "tool_workers.contract.failed", "exc_message": "m"},
        {
            "exc_type": "ToolError",
            "exc_module": "tool_workers.contract.failed",
            "exc_message": [1, 2],
        },
        "ToolError",
        None,
    ],
)
def test_another_failure_carries_no_result(payload: Any) -> None:
    assert result_of_failure(payload) is None


def test_the_orchestrator_reads_a_failed_call_as_it_reads_a_success() -> None:
    """Given the same error result stored as a SUCCESS (before) and as a failed task (now),
    then the model gets the same ToolResult, signed or not."""
    sent = ToolResult.error("tool_error", error_text(KeyError("k")), worker="w@h", pid=3)
    for key in (None, KEY):
        wire = sign_result(key, TASK_ID, sent.to_wire()) if key else sent.to_wire()
        as_success = result_from_meta(
            {"status": "SUCCESS", "result": wire}, "boom", task_id=TASK_ID, signing_key=key
        )
        as_failure = result_from_meta(
            stored_failure(failure_of(wire)), "boom", task_id=TASK_ID, signing_key=key
        )

        assert as_failure == as_success
        assert (as_failure.status, as_failure.error_kind) == ("error", "tool_error")
        assert as_failure.content == sent.content


def test_a_failed_call_whose_result_is_forged_is_refused_as_a_forged_success_is() -> None:
    wire = sign_result(KEY, TASK_ID, ToolResult.error("tool_error", "Error: a").to_wire())
    forged = {**wire, "content": "Error: b"}

    result = result_from_meta(
        stored_failure(failure_of(forged)), "boom", task_id=TASK_ID, signing_key=KEY
    )

    assert (result.error_kind, "Error: b" in str(result.content)) == ("protocol", False)


def test_metrics_and_spans_count_a_failed_call_by_its_error_kind() -> None:
    timed_out = failure_of(ToolResult.error("timeout", "Error: slow").to_wire())
    raised = failure_of(ToolResult.error("tool_error", "Error: boom").to_wire())

    assert returned_outcome("FAILURE", timed_out) == "timeout"
    assert returned_outcome("FAILURE", raised) == "tool_error"
    assert returned_outcome("FAILURE", ValueError("other")) == "failure"
