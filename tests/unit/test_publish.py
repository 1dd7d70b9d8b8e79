"""The publisher: each call claimed (SET NX) and published at most once, without services.

The broker is kombu's in-memory transport; the claim markers live in a small stand-in
for the few Redis commands the publisher uses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from orchestrator.calls import PreparedCall
from orchestrator.dispatch.publish import Publisher
from tool_workers.contract.broker import create_app
from tool_workers.contract.models import ToolRequest, TraceContext
from tool_workers.contract.names import call_marker_key
from tool_workers.contract.settings import Settings


class MarkerStore:
    """The Redis commands the publisher issues, on a dict (pipelines run at once)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.fail_next = 0

    def pipeline(self, transaction: bool = False) -> MarkerStore.Pipeline:
        return MarkerStore.Pipeline(self)

    def delete(self, *keys: str) -> int:
        return sum(self.values.pop(k, None) is not None for k in keys)

    class Pipeline:
        def __init__(self, store: MarkerStore) -> None:
            self.store = store
            self.ops: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

        def __enter__(self) -> MarkerStore.Pipeline:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def set(self, key: str, value: str, nx: bool = False, ex: int | None = None) -> None:
            self.ops.append(("set", (key, value), {"nx": nx}))

        def exists(self, key: str) -> None:
            self.ops.append(("exists", (key,), {}))

        def get(self, key: str) -> None:
            self.ops.append(("get", (key,), {}))

        def execute(self) -> list[Any]:
            import redis

            if self.store.fail_next:
                self.store.fail_next -= 1
                raise redis.ConnectionError("Redis restarting")
            out: list[Any] = []
            for op, args, kwargs in self.ops:
                if op == "set":
                    key, value = args
                    if kwargs["nx"] and key in self.store.values:
                        out.append(None)
                    else:
                        self.store.values[key] = value
                        out.append(True)
                elif op == "get":
                    out.append(self.store.values.get(args[0]))
                else:
                    out.append(int(args[0] in self.store.values))
            return out


@pytest.fixture
def app() -> Iterator[Celery]:
    settings = Settings(broker_url="memory://", result_backend="redis://127.0.0.1:1/0")
    made = create_app(settings)
    made.conf.broker_url = f"memory://{uuid.uuid4().hex}"
    yield made
    made.close()


def call(n: int) -> PreparedCall:
    return PreparedCall(
        tool="echo", call_id=f"c{n}", args={"text": str(n)}, task_id=f"task-{n}", thread_id="th"
    )


def queued(app: Celery, queue: str = "tools") -> list[Any]:
    messages = []
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        try:
            while True:
                message = simple.get(timeout=0.2)
                messages.append(message)
                message.ack()
        except simple.Empty:
            pass
        finally:
            simple.close()
    return messages


def test_given_fresh_calls_when_published_then_each_on_the_queue_once_and_marked_sent(
    app: Celery,
) -> None:
    markers = MarkerStore()
    publisher = Publisher(app, Settings(), markers, reply_to="toolfleet:reply:me")  # type: ignore[arg-type]

    attached = publisher.publish([call(1), call(2)])

    assert attached == []
    messages = queued(app)
    assert sorted(m.headers["id"] for m in messages) == ["task-1", "task-2"]
    first = next(m for m in messages if m.headers["id"] == "task-1")
    assert first.headers["task"] == "tools.echo"
    assert first.headers["argsrepr"] == "(echo call=c1 thread=th)"
    assert first.properties["reply_to"] == "toolfleet:reply:me"
    request = ToolRequest.model_validate(first.decode()[0][0])
    assert (request.call_id, request.args, request.idempotency_key) == (
        "c1",
        {"text": "1"},
        "task-1",
    )
    assert markers.values == {
        call_marker_key("toolfleet:", "task-1"): "sent",
        call_marker_key("toolfleet:", "task-2"): "sent",
    }


def test_given_calls_claimed_elsewhere_when_published_then_attached_not_sent_again(
    app: Celery,
) -> None:
    markers = MarkerStore()
    markers.values[call_marker_key("toolfleet:", "task-1")] = "sent"
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]

    attached = publisher.publish([call(1), call(2)])

    assert attached == [call(1)]
    assert [m.headers["id"] for m in queued(app)] == ["task-2"]


def test_given_broker_refusing_when_published_then_claims_released(app: Celery) -> None:
    markers = MarkerStore()
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]

    def refuse(*_: Any, **__: Any) -> None:
        raise ConnectionRefusedError("broker down")

    publisher.outbox._sender = refuse
    with pytest.raises(ConnectionRefusedError):
        publisher.publish([call(1)])

    assert markers.values == {}  # a later attempt may claim and publish it


def test_given_redis_blip_while_claiming_then_claim_retried(app: Celery) -> None:
    markers = MarkerStore()
    markers.fail_next = 1
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]

    assert publisher.publish([call(1)]) == []
    assert [m.headers["id"] for m in queued(app)] == ["task-1"]


def test_given_a_claim_whose_reply_was_lost_then_the_retry_publishes_it(app: Celery) -> None:
    markers = MarkerStore()
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]
    real_execute = MarkerStore.Pipeline.execute
    lost = []

    def reply_lost(pipe: MarkerStore.Pipeline) -> list[Any]:
        replies = real_execute(pipe)  # the claim is made...
        if not lost:
            lost.append(True)
            raise redis.TimeoutError("reply lost")  # ...but its reply never arrives
        return replies

    MarkerStore.Pipeline.execute = reply_lost  # type: ignore[method-assign]
    try:
        assert publisher.publish([call(1)]) == []  # its own claim: published, not attached
    finally:
        MarkerStore.Pipeline.execute = real_execute  # type: ignore[method-assign]
    assert [m.headers["id"] for m in queued(app)] == ["task-1"]


def test_given_no_claim_and_no_result_then_abandoned(app: Celery) -> None:
    markers = MarkerStore()
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]

    assert publisher.abandoned(call(1))
    markers.values[call_marker_key("toolfleet:", "task-1")] = "pending"
    assert not publisher.abandoned(call(1))


def test_given_traced_and_untraced_calls_when_published_then_trace_only_where_set(
    app: Celery,
) -> None:
    """Given one call with a trace context and one without, when published, then the
    untraced body has no ``trace`` field at all (a worker from before the field accepts
    it) and no trace headers; the traced one carries its context in the body and its
    W3C headers in the message headers (for Celery's OpenTelemetry instrumentation on
    the workers), and its context is current while its message is published."""
    from dataclasses import replace

    from opentelemetry import trace

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    trace_ctx = TraceContext(
        traceparent=traceparent, tracestate="vendor=1", langsmith_trace="20240101T000000000000Z1f0c"
    )
    markers = MarkerStore()
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]
    current: dict[str, str] = {}
    send = publisher.outbox._sender

    def sender(*args: Any, **kwargs: Any) -> Any:
        span = trace.get_current_span().get_span_context()
        current[str(len(current))] = f"{span.trace_id:032x}" if span.is_valid else ""
        return send(*args, **kwargs)

    publisher.outbox._sender = sender
    publisher.publish([call(1), replace(call(2), trace=trace_ctx)])

    messages = {m.headers["id"]: m for m in queued(app)}
    plain, traced = messages["task-1"], messages["task-2"]
    assert "trace" not in plain.decode()[0][0]
    assert "traceparent" not in plain.headers
    assert traced.decode()[0][0]["trace"]["traceparent"] == traceparent
    assert (traced.headers["traceparent"], traced.headers["tracestate"]) == (
        traceparent,
        "vendor=1",
    )
    assert "langsmith-trace" not in traced.headers
    assert sorted(current.values()) == ["", "0af7651916cd43dd8448eb211c80319c"]


def test_given_a_build_in_progress_then_a_build_that_must_not_wait_is_refused(
    app: Celery,
) -> None:
    """Given another thread building messages (it may be connecting or declaring a queue),
    when an event loop's publication asks to build without waiting, then it is refused
    at once (the loop hands its calls to the publishing threads) instead of blocking; a
    build that may wait gets its turn once the other one is done."""
    import threading

    from orchestrator.dispatch.outbox import Busy

    publisher = Publisher(app, Settings(), MarkerStore())  # type: ignore[arg-type]
    outbox = publisher.outbox
    holding, release = threading.Event(), threading.Event()

    def other_build() -> None:
        with outbox._lock:
            holding.set()
            release.wait(5)

    other = threading.Thread(target=other_build)
    other.start()
    try:
        assert holding.wait(5)
        with pytest.raises(Busy):
            outbox.build([call(1)], wait=False)
    finally:
        release.set()
        other.join(5)
    assert outbox.build([call(1)]) is None  # the memory transport cannot hand commands over
    publisher.close()
