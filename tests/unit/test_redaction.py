"""What Flower and the worker log may show of a call: its masked arguments, identity and
status, never its result."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery.app import trace
from celery.utils.saferepr import saferepr
from celery.worker.request import Request

from tool_workers.celery_ext.redaction import (
    ARGS_CHARS,
    VALUE_CHARS,
    SucceededLineFilter,
    ToolCallRequest,
    ToolTaskResult,
    args_summary,
    result_summary,
    short_result_repr,
)
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


def test_a_tool_tasks_result_is_summed_up_without_walking_it() -> None:
    """Given a tool task's return value, Celery's tracer gets its status alone as its
    repr (what the log line and Flower's event show of it anyway), not a repr of the
    whole result it would then throw away."""
    short_result_repr()
    ok = ToolTaskResult(ToolResult(content="the secret file content " * 100).to_wire())

    assert trace.saferepr(ok, 1024) == "{'status': 'success'}"
    assert result_summary(trace.saferepr(ok, 1024)) == "<success>"
    assert trace.saferepr({"status": "success", "content": "x"}, 1024) == (
        "{'status': 'success', 'content': 'x'}"
    )


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


def test_inspect_replies_carry_the_summaries_whoever_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower asks a worker for its active and reserved tasks without safe=True."""
    asked: list[bool] = []
    body = [{"args": {"pattern": "pw", "token": "t0k"}}]

    def info(self: Request, safe: bool = False) -> dict[str, Any]:
        asked.append(safe)
        return {
            "args": "" if safe else body,
            "kwargs": "(grep call=c1 thread=t1)" if safe else {},
        }

    monkeypatch.setattr(Request, "info", info)
    monkeypatch.setattr(Request, "args", property(lambda self: body))
    request = ToolCallRequest.__new__(ToolCallRequest)

    assert request.info() == {
        "args": "(pattern='pw', token='***')",
        "kwargs": "(grep call=c1 thread=t1)",
    }
    assert asked == [True]


def test_args_summary_masks_secret_fields_and_url_passwords_and_cuts_long_values() -> None:
    args = {
        "path": "notes.txt",
        "api_key": "sk-live-123",
        "headers": {"Authorization": "Bearer abc", "accept": "json"},
        "url": "postgresql://app:swordfish@db/app",
        "body": "x" * 500,
        "n": 3,
    }

    shown = args_summary(args)

    assert shown.startswith("(path='notes.txt', api_key='***', ")
    assert len(shown) == ARGS_CHARS and shown.endswith("...)")
    assert args_summary({"headers": args["headers"]}) == (
        "(headers={'Authorization': '***', 'accept': 'json'})"[: ARGS_CHARS - 4] + "...)"
    )
    assert "Bearer" not in args_summary({"h": args["headers"]})
    assert args_summary({"u": "redis://a:swordfish@h"}) == "(u='redis://a:***@h')"
    assert "swordfish" not in args_summary({"url": args["url"]})
    assert args_summary({"body": args["body"]}) == f"(body='{'x' * (VALUE_CHARS - 3)}...')"
    assert args_summary({"text": "hi", "n": 2}) == "(text='hi', n=2)"
    assert args_summary("not a dict") == "(?)"


def test_the_request_shows_the_calls_arguments_masked_in_events_and_inspect_replies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task-received event and the log carry ``argsrepr``; inspect replies ``args``."""
    request = login_request(monkeypatch, Eventer(groups=None))  # task events on (-E)

    assert request.argsrepr == "(user='ann', password='***')"
    assert request.info() == {"args": "(user='ann', password='***')", "kwargs": "k"}


class Eventer:
    """A worker's event dispatcher, as a request sees it."""

    def __init__(self, groups: set[str] | None) -> None:
        self.enabled = True
        self.groups = groups


def login_request(monkeypatch: pytest.MonkeyPatch, eventer: Eventer) -> ToolCallRequest:
    request = ToolCallRequest.__new__(ToolCallRequest)
    request.eventer = eventer
    body = [{"tool": "login", "args": {"user": "ann", "password": "pw"}}]
    monkeypatch.setattr(Request, "args", property(lambda self: body))
    monkeypatch.setattr(
        Request, "info", lambda self, safe=False: {"args": body if not safe else "", "kwargs": "k"}
    )
    return request


def test_the_arguments_are_summed_up_only_where_celery_will_show_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a worker whose events are its heartbeats alone and whose log skips the
    "Received task" line, Celery still asks every delivery for its arguments' summary
    (for a task-received event its dispatcher then drops): it gets none. Once task events
    are on (Flower's enable_events adds them), it gets the summary; inspect always does."""
    eventer = Eventer(groups={"worker"})
    request = login_request(monkeypatch, eventer)

    assert request.argsrepr == ""
    assert request.info()["args"] == "(user='ann', password='***')"
    eventer.groups.add("task")
    assert request.argsrepr == "(user='ann', password='***')"
