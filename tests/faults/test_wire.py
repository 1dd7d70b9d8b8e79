"""No message kills or wedges a worker: hand-made messages straight onto the queue.

Each message below is published with kombu, as any client with broker access could.
Whatever its body, headers, content type or encoding, the prefork worker stays up,
answers it with a stored failure when it carries a usable task id (or drops it with one
log line when it does not), and serves the next ordinary call.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from amqp.exceptions import AMQPError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import dispatcher_for
from orchestrator.dispatch.outcome import result_from_meta
from orchestrator.local import WorkerProcess
from tests.support.amqp import AMQP_NAMESPACES, brokers
from tests.support.fleet import FAULT_POLICY, fleet_settings, worker_env
from tests.support.wire import (
    call_headers,
    direct,
    publish_raw,
    push_raw,
    wait_stored,
    watch_only,
)
from tool_workers.contract.models import ToolRequest
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)

NOT_PUBLISHABLE = (struct.error, AMQPError, OverflowError)
"""What publishing a message AMQP cannot carry raises (client side, or RabbitMQ's refusal)."""

VALID_REQUEST = ToolRequest(
    tool="add", call_id="c", args={"a": 1, "b": 2}, idempotency_key="k"
).model_dump(mode="json")


@pytest.fixture(scope="module", params=brokers())
def fleet(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, WorkerProcess]]:
    """One prefork worker shared by this module's tests, per broker (RabbitMQ too when
    ``TOOLFLEET_TEST_AMQP_URL`` is set: its messages carry AMQP properties and headers)."""
    workdir = tmp_path_factory.mktemp("wire")
    overrides: dict[str, Any] = {}
    if request.param == "rabbitmq":
        amqp_url = request.getfixturevalue("amqp_url")
        overrides = {"broker_url": amqp_url, "result_backend": redis_url}
    fleet = fleet_settings(
        redis_url, workdir, config=FAULT_POLICY, redelivery_margin=2.0, **overrides
    )
    if request.param == "rabbitmq":
        AMQP_NAMESPACES.append(fleet.namespace)
    worker = WorkerProcess(
        fleet,
        pool="prefork",
        concurrency=2,
        queues=("tools",),
        log_file=workdir / "worker.log",
        extra_env=worker_env(fleet),
    )
    with worker:
        yield fleet, worker


def assert_serving(fleet: Settings, worker: WorkerProcess) -> None:
    """The worker process is alive and answers an ordinary call."""
    result = dispatcher_for(settings=fleet).wait(direct("add", a=20, b=22), timeout=20)
    assert result.content == "42", result
    assert worker.process is not None and worker.process.poll() is None, "the worker exited"


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param(json_bytes("hello"), {}, id="body-string"),
        pytest.param(json_bytes({}), {}, id="body-object"),
        pytest.param(json_bytes(None), {}, id="body-null"),
        pytest.param(json_bytes([[VALID_REQUEST], {}, {}, {}]), {}, id="body-4-items"),
        pytest.param(json_bytes([[VALID_REQUEST], [], {}]), {}, id="kwargs-not-object"),
        pytest.param(
            json_bytes([[VALID_REQUEST], {}, {"id": "someone-else"}]), {}, id="embed-overrides"
        ),
        pytest.param(json_bytes([[VALID_REQUEST], {}, {}]), {"timelimit": 5}, id="timelimit-int"),
        pytest.param(
            json_bytes([[VALID_REQUEST], {}, {}]), {"timelimit": "x"}, id="timelimit-string"
        ),
        pytest.param(
            json_bytes([[VALID_REQUEST], {}, {}]), {"timelimit": [1, 2, 3]}, id="timelimit-3"
        ),
        pytest.param(
            json_bytes([[VALID_REQUEST], {}, {}]), {"retries": "many"}, id="retries-string"
        ),
    ],
)
def test_malformed_message_is_answered_and_worker_keeps_serving(
    fleet: tuple[Settings, WorkerProcess], body: bytes, headers: dict[str, Any]
) -> None:
    """Given a message with a task id whose body or headers Celery cannot take, when it
    arrives, then its waiter gets a protocol error and the worker serves the next call."""
    settings_, worker = fleet
    dispatcher, call = watch_only(settings_, "add")

    publish_raw(
        settings_,
        body,
        call_headers(call.task_id, **headers),
        content_type="application/json",
        content_encoding="utf-8",
    )
    result = dispatcher.wait(call, timeout=20)

    assert result.status == "error" and result.error_kind == "protocol", result
    assert_serving(settings_, worker)


@pytest.mark.parametrize(
    ("content_type", "content_encoding"),
    [
        pytest.param("text/plain", "utf-8", id="text-plain"),
        pytest.param("application/x-unknown", "utf-8", id="unknown-type"),
        pytest.param("application/data", "binary", id="raw-bytes"),
        # kombu reads a JSON body as JSON whatever its declared encoding; a text body is
        # decoded with the encoding it names.
        pytest.param("application/text", "rot13", id="rot13"),
        pytest.param("application/text", "x-no-such-codec", id="unknown-encoding"),
        pytest.param("application/text", "utf-16", id="wrong-encoding"),
    ],
)
def test_odd_content_type_or_encoding_is_answered(
    fleet: tuple[Settings, WorkerProcess], content_type: str, content_encoding: str
) -> None:
    """Given a well-formed body sent with a content type or encoding the worker does not
    take, when it arrives, then its waiter gets a protocol error and the worker serves."""
    settings_, worker = fleet
    dispatcher, call = watch_only(settings_, "add")

    publish_raw(
        settings_,
        json_bytes([[VALID_REQUEST], {}, {}]),
        call_headers(call.task_id),
        content_type=content_type,
        content_encoding=content_encoding,
    )
    result = dispatcher.wait(call, timeout=20)

    assert result.status == "error" and result.error_kind == "protocol", result
    assert_serving(settings_, worker)


@pytest.mark.parametrize(
    "task_id", [None, "", 42, "x" * 1000], ids=["none", "empty", "int", "long"]
)
def test_message_without_usable_id_is_dropped_with_one_log_line(
    fleet: tuple[Settings, WorkerProcess], task_id: Any
) -> None:
    """Given an otherwise valid call message without a usable ``id`` header, when it
    arrives, then the worker drops it with one log line and keeps answering calls (its
    consumer does not restart)."""
    settings_, worker = fleet
    assert worker.log_file is not None
    before = worker.log_file.read_text(errors="replace")
    marker = f"argsrepr-{uuid.uuid4().hex}"
    headers = call_headers(None, argsrepr=marker)
    if task_id is not None:
        headers["id"] = task_id

    publish_raw(
        settings_,
        json_bytes([[VALID_REQUEST], {}, {}]),
        headers,
        content_type="application/json",
        content_encoding="utf-8",
    )
    assert_serving(settings_, worker)
    assert_serving(settings_, worker)

    new = worker.log_file.read_text(errors="replace")[len(before) :]
    refused = [line for line in new.splitlines() if "refused a message" in line]
    assert len(refused) == 1, new
    assert "id unusable" in refused[0]
    assert "Restarting" not in new and "Unrecoverable" not in new, new


# Redis only: an entry below kombu's envelope. Every AMQP message has properties and
# headers (the other cases here send the odd ones).
@pytest.mark.parametrize("fleet", ["redis"], indirect=True)
@pytest.mark.parametrize(
    "entry",
    [
        b"not json",
        b"[]",
        b'{"body": 1}',
        json.dumps({"body": "", "headers": {}, "properties": {}}).encode(),
    ],
    ids=["not-json", "list", "no-properties", "no-delivery-info"],
)
def test_queue_entry_that_is_no_message_is_dropped(
    fleet: tuple[Settings, WorkerProcess], entry: bytes
) -> None:
    """Given an entry pushed straight onto the queue's Redis list that is not a kombu
    message envelope, when the worker pops it, then it drops it with one log line (it
    used to exit with an unrecoverable error) and keeps serving without reconnecting."""
    settings_, worker = fleet
    assert worker.log_file is not None
    before = worker.log_file.read_text(errors="replace")

    push_raw(settings_, entry)
    assert_serving(settings_, worker)

    new = worker.log_file.read_text(errors="replace")[len(before) :]
    dropped = [line for line in new.splitlines() if "dropped an entry" in line]
    refused = [line for line in new.splitlines() if "refused a message" in line]
    assert len(dropped) + len(refused) == 1, new
    assert "Connection to broker lost" not in new and "Unrecoverable" not in new, new


# --- the fuzz: generated messages, in batches, against the same worker ---------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
# A request the worker must refuse: never all of tool, call_id and idempotency_key.
_bad_request = st.one_of(_json, st.just({"tool": "add", "args": {"a": 1}}))
_bodies = st.one_of(
    _json.map(json_bytes),
    st.binary(max_size=64),
    st.tuples(_bad_request, _json).map(lambda ra: json_bytes([[ra[0]], {}, ra[1]])),
    st.tuples(_bad_request, _json).map(lambda rk: json_bytes([[rk[0]], rk[1], {}])),
    _bad_request.map(lambda r: json_bytes([[r], {}, {}])),
    _bad_request.map(lambda r: json_bytes([[r], {}, {}, {}])),
)
# Strings here never parse as a date, so no message is scheduled for later.
_not_a_date = st.one_of(st.none(), st.integers(), st.sampled_from(["soon", "", "2026-13-45"]))
_header_values: dict[str, Any] = {
    "task": st.one_of(
        _json,
        st.sampled_from(
            ["tools.add", "tools.no_such_tool", "add", "celery.accumulate", "celery.chord_unlock"]
        ),
    ),
    "timelimit": _json,
    "retries": _json,
    "eta": _not_a_date,
    "expires": _not_a_date,
    "shadow": _json,
    "root_id": _json,
    "parent_id": _json,
    "group": _json,
    "argsrepr": _json,
    "kwargsrepr": _json,
    "compression": st.one_of(_json, st.sampled_from(["zlib", "bzip2"])),
    "stamps": _json,
    "stamped_headers": _json,
    "reply_to": _json,
    "ignore_result": st.one_of(st.booleans(), _json),
}


@st.composite
def _messages(draw: st.DrawFn) -> dict[str, Any]:
    answer_id: str | None = str(uuid.uuid4())
    task_id: Any = answer_id
    if draw(st.integers(0, 9)) == 0:  # a tenth carry no usable id
        task_id, answer_id = draw(st.one_of(st.just(None), _json)), None
    headers = call_headers(None)
    if task_id is not None:
        headers["id"] = task_id
    for key in draw(st.lists(st.sampled_from(sorted(_header_values)), max_size=3, unique=True)):
        if draw(st.booleans()):
            headers[key] = draw(_header_values[key])
        else:
            headers.pop(key, None)
    return {
        "answer_id": answer_id,
        "body": draw(_bodies),
        "headers": headers,
        "content_type": draw(
            st.sampled_from(
                [
                    "application/json",
                    "application/json",
                    "text/plain",
                    "application/data",
                    "application/text",
                    "application/x-python-serialize",
                    "application/x-yaml",
                    "x/y",
                ]
            )
        ),
        "content_encoding": draw(
            st.sampled_from(["utf-8", "utf-8", "binary", "latin-1", "utf-16", "rot13", "nope"])
        ),
    }


@settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(_messages(), min_size=1, max_size=8))
def test_fuzzed_messages_never_stop_the_worker(
    fleet: tuple[Settings, WorkerProcess], batch: list[dict[str, Any]]
) -> None:
    """Given a batch of generated messages (bodies, headers, content types, encodings),
    when they reach the worker, then it stays up and serves an ordinary call, and every
    message with a usable task id has an error stored."""
    settings_, worker = fleet
    delivered = []
    for message in batch:
        try:
            publish_raw(
                settings_,
                message["body"],
                message["headers"],
                content_type=message["content_type"],
                content_encoding=message["content_encoding"],
            )
        except NOT_PUBLISHABLE:
            if not settings_.broker_is_amqp:
                raise
            # AMQP headers are typed field tables: py-amqp cannot encode some values (an
            # int past 64 bits), and RabbitMQ refuses others (INTERNAL_ERROR on publish).
            # Such a message never reaches a worker.
            continue
        delivered.append(message)

    assert_serving(settings_, worker)
    for message in delivered:
        if message["answer_id"] is not None:
            meta = wait_stored(settings_, message["answer_id"])
            result = result_from_meta(meta, "add")
            assert result.status == "error", (message, meta)
