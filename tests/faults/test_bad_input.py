"""Bad input gets a clear error and loses nothing: poison on the queue, oversize calls,
transient failures retried by Celery."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator import dispatcher_for
from orchestrator.local import WorkerProcess
from tests.support.fleet import FAULT_POLICY, effects, fleet_settings, worker_env
from tests.support.wire import (
    call_headers,
    direct,
    publish_raw,
    stored_meta,
    wait_stored,
    watch_only,
)
from tool_workers.contract.models import MAX_ID_CHARS, PROTOCOL_VERSION
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """One prefork worker with small byte limits, shared by this module's tests."""
    workdir = tmp_path_factory.mktemp("bad-input")
    settings = fleet_settings(
        redis_url,
        workdir,
        config=FAULT_POLICY,
        redelivery_margin=2.0,
        max_arg_bytes=2_000,
        max_result_bytes=500,
    )
    worker = WorkerProcess(
        settings,
        pool="prefork",
        concurrency=2,
        queues=("tools", "prefork"),
        log_file=workdir / "worker.log",
        extra_env=worker_env(settings),
    )
    with worker:
        yield settings


@pytest.mark.parametrize(
    "poison",
    [
        pytest.param({"serializer": "pickle"}, id="pickle"),
        pytest.param(
            {"content_type": "application/json", "content_encoding": "utf-8"}, id="not-json"
        ),
        pytest.param(
            {"content_type": "application/x-yaml", "content_encoding": "utf-8"}, id="yaml"
        ),
    ],
)
def test_unreadable_message_is_answered_and_worker_keeps_serving(
    fleet: Settings, poison: dict[str, Any]
) -> None:
    """Given a message whose body the worker refuses or cannot decode, when it arrives,
    then the waiting orchestrator gets an error result, and the worker serves the next
    call normally."""
    dispatcher, call = watch_only(fleet, "add")
    body: Any = b"\x80not json{" if "serializer" not in poison else [[{"a": 1}], {}, {}]
    publish_raw(fleet, body, call_headers(call.task_id), **poison)

    result = dispatcher.wait(call, timeout=20)
    after = dispatcher.wait(direct("add", a=1, b=2), timeout=20)

    assert result.status == "error" and result.error_kind == "protocol"
    assert "could not read" in result.content
    assert after.content == "3"


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        pytest.param({"tool": "add", "args": {}}, "malformed", id="missing-fields"),
        pytest.param(
            {
                "protocol_version": PROTOCOL_VERSION + 1,
                "tool": "add",
                "call_id": "x",
                "idempotency_key": "x",
                "args": {"a": 1, "b": 1},
            },
            "protocol version",
            id="unknown-version",
        ),
        pytest.param("not even a dict", "malformed", id="wrong-shape"),
    ],
)
def test_malformed_request_is_answered(fleet: Settings, request_body: Any, expected: str) -> None:
    """Given a well-formed Celery message whose toolfleet request is wrong, when the worker
    runs it, then the model gets a protocol error naming what is wrong."""
    dispatcher, call = watch_only(fleet, "add")
    publish_raw(fleet, [[request_body], {}, {}], call_headers(call.task_id), serializer="json")

    result = dispatcher.wait(call, timeout=20)

    assert result.status == "error" and result.error_kind == "protocol"
    assert expected in result.content


def test_oversize_arguments_are_refused_and_results_truncated(fleet: Settings) -> None:
    """Given byte limits, when a call's arguments or result exceed them, then oversize
    arguments are refused with the sizes named and an oversize result is truncated."""
    dispatcher = dispatcher_for(settings=fleet)

    big_args = dispatcher.wait(direct("echo_cls", text="x" * 5_000), timeout=20)
    big_result = dispatcher.wait(direct("sleep_for", seconds=0, label="y" * 1_000), timeout=20)

    assert big_args.status == "error" and big_args.error_kind == "too_large"
    assert "over the limit of 2000 bytes" in big_args.content
    assert big_result.status == "success"
    assert "result truncated from" in big_result.content
    assert len(big_result.content.encode()) < 700


def test_transient_failure_is_retried_by_celery(fleet: Settings, counter: Any) -> None:
    """Given a tool that fails twice with a transient error and a policy of 3 retries,
    when called, then Celery retries it and the model sees one successful result."""
    dispatcher = dispatcher_for(settings=fleet)
    call = direct("flaky", times=2)

    result = dispatcher.wait(call, timeout=30)

    assert result.status == "success"
    assert result.content == "ok after 3 attempts (attempt 3)"
    assert effects(counter, fleet, "flaky")[call.task_id] == 3


def test_retries_exhausted_give_one_error(fleet: Settings, counter: Any) -> None:
    """Given a tool failing more often than its retries allow, when called, then after the
    last retry the model gets one error naming the transient failure."""
    dispatcher = dispatcher_for(settings=fleet)
    call = direct("flaky", times=10)

    result = dispatcher.wait(call, timeout=30)

    assert result.status == "error"
    assert "ConnectionError('transient failure 4')" in result.content
    assert effects(counter, fleet, "flaky")[call.task_id] == 4


@pytest.mark.parametrize("field", ["thread_id", "run_id", "call_id"])
def test_overlong_ids_are_refused_quickly(fleet: Settings, field: str) -> None:
    """Given a call whose id is 40,000 characters long, when a worker receives it, then
    the model gets a protocol error naming the field, within seconds (masking the log
    line that carries the id once held the pool slot for 8 s)."""
    dispatcher = dispatcher_for(settings=fleet)
    call = dataclasses.replace(direct("add", a=1, b=2), **{field: "t" * 40_000})

    started = time.monotonic()
    result = dispatcher.wait(call, timeout=30)

    assert result.status == "error" and result.error_kind == "protocol", result
    assert field in result.content and f"longer than {MAX_ID_CHARS}" in result.content
    assert time.monotonic() - started < 5


def test_overlong_tool_name_is_refused(fleet: Settings) -> None:
    dispatcher, call = watch_only(fleet, "add")
    request = {"tool": "a" * 1_000, "call_id": "c", "idempotency_key": "k", "args": {}}

    publish_raw(fleet, [[request], {}, {}], call_headers(call.task_id), serializer="json")
    result = dispatcher.wait(call, timeout=20)

    assert result.status == "error" and result.error_kind == "protocol"
    assert "tool" in result.content and f"longer than {MAX_ID_CHARS}" in result.content


def test_oversize_artifact_is_refused_before_it_crosses(fleet: Settings) -> None:
    """Given a result limit of 500 bytes, when a tool returns a 20 kB artifact, then the
    model gets a too_large error and the stored result is small (it used to cross)."""
    dispatcher = dispatcher_for(settings=fleet)
    call = direct("with_artifact", n=2_000)

    result = dispatcher.wait(call, timeout=20)

    assert result.status == "error" and result.error_kind == "too_large", result
    assert "artifact" in result.content and result.artifact is None
    meta = stored_meta(fleet, call.task_id)
    assert meta is not None and len(json.dumps(meta)) < 2_000


def test_request_naming_another_tool_is_refused(fleet: Settings, counter: Any) -> None:
    """Given a tools.add message whose request names the tool 'touch', when the worker
    receives it, then nothing runs and the waiter gets a protocol error."""
    dispatcher, call = watch_only(fleet, "add")
    request = {
        "tool": "touch",
        "call_id": "c",
        "idempotency_key": call.task_id,
        "args": {"tag": "mismatch"},
    }

    publish_raw(fleet, [[request], {}, {}], call_headers(call.task_id), serializer="json")
    result = dispatcher.wait(call, timeout=20)

    assert result.status == "error" and result.error_kind == "protocol", result
    assert "names another tool" in result.content
    assert effects(counter, fleet, "touch") == {}


@pytest.mark.parametrize(
    ("task", "args"),
    [
        ("celery.accumulate", [1, 2]),
        ("celery.backend_cleanup", []),
        ("celery.chord_unlock", ["group-id", {"task": "tools.add"}]),
        ("celery.chain", []),
    ],
)
def test_celery_builtin_tasks_are_refused(fleet: Settings, task: str, args: list[Any]) -> None:
    """Given a message for one of Celery's own tasks on the tools queue, when a worker
    receives it, then the task does not run and its id gets a stored failure."""
    task_id = direct("add").task_id
    headers = {**call_headers(task_id), "task": task}

    publish_raw(fleet, [args, {}, {}], headers, serializer="json")
    meta = wait_stored(fleet, task_id)

    assert meta["status"] == "FAILURE", meta
    assert meta["result"]["exc_type"] == "UnreadableCall"
    assert "not a tool call" in str(meta["result"]["exc_message"])
