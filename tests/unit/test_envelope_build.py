"""A call's task message is the one Celery's own client builds, and kombu reads it back.

The orchestrator builds task messages itself (:mod:`orchestrator.dispatch.envelope`);
these tests pin that to Celery's ``app.amqp.create_task_message`` field by field (each
header sent has Celery's value; the ones left out are exactly the documented optional
ones, and Celery's worker takes each with the default Celery would have sent), and the
Redis envelope to what kombu's Redis transport decodes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from celery import Celery
from kombu.transport.virtual import Message

from orchestrator.call import PreparedCall
from orchestrator.dispatch.envelope import LEFT_OUT, redis_envelope, task_message
from tool_workers.contract.models import TraceContext

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def call(**fields: Any) -> PreparedCall:
    values: dict[str, Any] = {
        "tool": "echo",
        "call_id": "call_1",
        "args": {"text": "hi"},
        "task_id": "5dcccc79-573c-5b59-b9bc-26f4557a71ae",
        "thread_id": "t-1",
        "queue": "tools",
    }
    values.update(fields)
    return PreparedCall(**values)


def celerys(made: PreparedCall, reply_to: str, expires: Any = None) -> Any:
    app = Celery("pin", set_as_current=False)
    message = made.request().to_wire()
    return app.amqp.create_task_message(
        made.task_id,
        f"tools.{made.tool}",
        (message,),
        {},
        reply_to=reply_to,
        kwargsrepr=f"({made.tool} call={made.call_id} thread={made.thread_id} queue={made.queue})",
        expires=expires,
    )


def test_given_a_call_then_its_message_is_celerys_field_for_field() -> None:
    made = call()
    ours = task_message(made, "toolfleet:reply:abc")
    theirs = celerys(made, "toolfleet:reply:abc")

    assert {k: theirs.headers[k] for k in ours.headers} == ours.headers
    assert set(theirs.headers) - set(ours.headers) == LEFT_OUT | {"expires"}
    assert ours.properties == {"reply_to": theirs.properties["reply_to"]}
    args, kwargs, embed = json.loads(json.dumps(ours.body))
    assert [args, kwargs] == json.loads(json.dumps(list(theirs.body[:2])))
    assert embed == {} and not any(theirs.body[2].values())


def test_given_the_headers_left_out_then_celerys_worker_reads_what_celery_would_send() -> None:
    """A worker's request built from our message sees the defaults Celery would send."""
    from celery.worker.request import Request
    from kombu.transport.virtual import Message as VirtualMessage

    app = Celery("pin", set_as_current=False)

    @app.task(name="tools.echo", shared=False)
    def echo(request: Any) -> None: ...

    message = task_message(call(), "toolfleet:reply:abc")
    payload = json.loads(redis_envelope(message, "tools"))

    class Channel:
        def decode_body(self, body: Any, encoding: Any = None) -> Any:
            return body

    request = Request(VirtualMessage(payload, channel=Channel()), app=app, task=echo)
    assert request.id == call().task_id and request.name == "tools.echo"
    assert (request.eta, request.expires, request.time_limits) == (None, None, (None, None))
    assert request.request_dict.get("retries", 0) == 0
    assert not request.ignore_result
    assert request.reply_to == "toolfleet:reply:abc"


def test_given_a_deadline_then_expires_is_the_iso_time_celery_honours() -> None:
    import datetime

    at = 1_900_000_000.5
    ours = task_message(call(expires_at=at), "r")
    theirs = celerys(call(), "r", expires=datetime.datetime.fromtimestamp(at, tz=datetime.UTC))

    assert ours.headers["expires"] == theirs.headers["expires"]


def test_given_a_traced_call_then_the_w3c_headers_ride_with_the_message_only() -> None:
    traced = call(trace=TraceContext(traceparent=TRACEPARENT, langsmith_trace="20240101T0Z1"))

    message = task_message(traced, "r")
    plain = task_message(call(), "r")

    assert message.headers["traceparent"] == TRACEPARENT
    assert "langsmith-trace" not in message.headers
    assert message.body[0][0]["trace"]["traceparent"] == TRACEPARENT
    assert "traceparent" not in plain.headers and "trace" not in plain.body[0][0]


def test_given_the_redis_envelope_then_kombu_reads_the_same_message() -> None:
    made = replace(call(), injected=None)
    message = task_message(made, "toolfleet:reply:abc")

    payload = json.loads(redis_envelope(message, "tools"))

    class Channel:
        def decode_body(self, body: Any, encoding: Any = None) -> Any:
            assert encoding is None  # JSON text, not base64
            return body

    read = Message(payload, channel=Channel())
    assert read.headers == message.headers
    assert read.properties["reply_to"] == "toolfleet:reply:abc"
    assert read.delivery_info == {"exchange": "", "routing_key": "tools"}
    assert read.decode() == message.body
    other = json.loads(redis_envelope(message, "tools"))
    assert payload["properties"]["delivery_tag"] != other["properties"]["delivery_tag"]
