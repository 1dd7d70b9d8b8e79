"""The early start the consumer hands a task body on its request: taken once, never
forged from the wire, never sent on with a retry."""

from __future__ import annotations

import json
import pickle

from celery.app.task import Context

from tool_workers.celery_ext.fence import EARLY_HEADER, EarlyStart, Start, take_early
from tool_workers.contract.models import ToolRequest

START = Start(1, False, False, 0, "", False, False, True)


def _request(value: object, task_id: str = "t-1") -> Context:
    # As Celery's trace makes the task's request of the delivery's headers.
    return Context({"id": task_id, "task": "tools.echo", EARLY_HEADER: value})


def test_the_consumers_early_start_is_taken_once_and_off_the_retried_headers() -> None:
    """Given a request carrying the consumer's early start, when the task body takes it,
    then it gets it once, and the request's custom headers (which a retry publishes on,
    as JSON) no longer hold it."""
    early = EarlyStart("t-1", start=START, pid=7)
    request = _request(early)
    assert EARLY_HEADER in (request.headers or {})
    assert take_early(request) is early
    assert take_early(request) is None
    assert EARLY_HEADER not in (request.headers or {})
    json.dumps(request.headers or {})


def test_a_header_from_the_wire_is_no_early_start() -> None:
    """Given a publisher that puts the header on its message (JSON: a dict, a list), when
    the task body looks, then there is no early start: the call starts as any other."""
    for forged in ({"task_id": "t-1", "start": [1, 0, 0, 0]}, ["t-1", 1], "t-1"):
        request = _request(forged)
        assert take_early(request) is None
        assert EARLY_HEADER not in (request.headers or {})


def test_an_early_start_of_another_call_is_not_taken() -> None:
    """Given an early start that names another call, when the task body looks, then it
    is not this call's."""
    assert take_early(_request(EarlyStart("t-2", start=START))) is None


def test_an_early_start_crosses_to_a_pool_process() -> None:
    """Given an early start with its admitted request, when Celery sends the request to
    a prefork pool process (pickled), then the process takes the same start."""
    request = ToolRequest(tool="echo", call_id="c", args={"text": "hi"}, idempotency_key="k")
    early = EarlyStart("t-1", request=request, start=START, since=3, pid=7)
    taken = take_early(pickle.loads(pickle.dumps(_request(early))))
    assert taken == early
