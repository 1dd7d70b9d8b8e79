"""What Flower and the worker log may show of a call: its identity and status only."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery.app import trace
from celery.utils.saferepr import saferepr
from celery.worker.request import Request

from tool_workers.celery_ext.redaction import SucceededLineFilter, ToolCallRequest, result_summary
from tool_workers.contract.models import ToolResult


def rstr(result: ToolResult) -> str:
    """What Celery computes for a tool task's return value (its default maxsize)."""
    return saferepr(result.model_dump(mode="json"), 1024)


def test_summary_keeps_the_status_only() -> None:
    ok = ToolResult(content="the secret file content " * 100, worker="w@h")
    failed = ToolResult.error("timeout", "Error: took too long")

    assert result_summary(rstr(ok)) == "<success>"
    assert result_summary(rstr(failed)) == "<error>"
    assert result_summary("not a tool result") == "<result>"


def succeeded_record(name: str, return_value: str) -> logging.LogRecord:
    context = {"id": "abc", "name": name, "return_value": return_value, "runtime": 0.5}
    return trace.logger.makeRecord(
        trace.logger.name, logging.INFO, __file__, 1, trace.LOG_SUCCESS, (context,), None
    )


def test_succeeded_line_of_a_tool_task_shows_the_summary() -> None:
    rec = succeeded_record("tools.read_file", rstr(ToolResult(content="password=swordfish")))

    assert SucceededLineFilter().filter(rec)

    assert rec.getMessage() == "Task tools.read_file[abc] succeeded in 0.5s: <success>"


def test_succeeded_line_of_another_task_is_left_alone() -> None:
    rec = succeeded_record("myapp.other", "'kept'")

    SucceededLineFilter().filter(rec)

    assert rec.getMessage().endswith(": 'kept'")


def test_task_succeeded_event_carries_the_summary_not_the_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        Request, "send_event", lambda self, type, **fields: sent.append((type, fields))
    )
    request = ToolCallRequest.__new__(ToolCallRequest)  # only send_event is exercised

    request.send_event("task-succeeded", result=rstr(ToolResult(content="swordfish")), runtime=1)
    request.send_event("task-started")

    assert sent == [
        ("task-succeeded", {"result": "<success>", "runtime": 1}),
        ("task-started", {}),
    ]


def test_inspect_replies_carry_the_argsrepr_whoever_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower asks a worker for its active and reserved tasks without safe=True."""
    asked: list[bool] = []

    def info(self: Request, safe: bool = False) -> dict[str, Any]:
        asked.append(safe)
        return {"args": "(grep call=c1 thread=t1)" if safe else [{"args": {"pattern": "pw"}}]}

    monkeypatch.setattr(Request, "info", info)
    request = ToolCallRequest.__new__(ToolCallRequest)

    assert request.info() == {"args": "(grep call=c1 thread=t1)"}
    assert asked == [True]
