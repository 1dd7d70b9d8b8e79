"""The publisher: each call claimed (SET NX) and published at most once, without services.

The broker is kombu's in-memory transport; the claim markers live in a small stand-in
for the few Redis commands the publisher uses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from orchestrator.calls import PreparedCall
from orchestrator.dispatch.publish import Publisher
from tool_workers.app import create_app
from tool_workers.protocol import ToolRequest, call_marker_key
from tool_workers.settings import Settings


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

    publisher._sender = refuse
    with pytest.raises(ConnectionRefusedError):
        publisher.publish([call(1)])

    assert markers.values == {}  # a later attempt may claim and publish it


def test_given_redis_blip_while_claiming_then_claim_retried(app: Celery) -> None:
    markers = MarkerStore()
    markers.fail_next = 1
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]

    assert publisher.publish([call(1)]) == []
    assert [m.headers["id"] for m in queued(app)] == ["task-1"]


def test_given_no_claim_and_no_result_then_abandoned(app: Celery) -> None:
    markers = MarkerStore()
    publisher = Publisher(app, Settings(), markers)  # type: ignore[arg-type]

    assert publisher.abandoned(call(1))
    markers.values[call_marker_key("toolfleet:", "task-1")] = "pending"
    assert not publisher.abandoned(call(1))
