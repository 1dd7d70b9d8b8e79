"""The RabbitMQ lease (:mod:`tool_workers.celery_ext.amqp_lease`) against a real Redis.

No broker and no worker: each test holds deliveries the way the consumer does, lets the
lease lapse, sweeps with a publisher that only records what it was given, and starts
deliveries with the start script, as a pool process would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tool_workers.celery_ext.amqp_lease import AmqpLease, dropped_unrun, handing_key
from tool_workers.celery_ext.fence import (
    COPY_HEADER,
    HOLDING_HEADER,
    START_SCRIPT,
    holding_token,
    parse_start,
    start_args,
)
from tool_workers.celery_ext.lease import leases_key
from tool_workers.contract.marker import CallMarker, marker_key
from tool_workers.contract.settings import Settings

TTL = 0.3


class Message:
    """What the consumer's hold reads of a kombu message."""

    def __init__(self, task: str, headers: dict[str, Any] | None = None) -> None:
        self.headers: dict[str, Any] = {"id": task, "task": "tools.step", **(headers or {})}
        self.body = json.dumps([[{"tool": "step"}], {}, {}]).encode()
        self.properties = {"correlation_id": task, "reply_to": "r", "delivery_mode": 2}
        self.delivery_info = {"exchange": "ns:tools", "routing_key": "ns:tools"}
        self.content_type = "application/json"
        self.content_encoding = "utf-8"


class Request:
    """A task's request context, carrying the holding the consumer noted."""

    def __init__(self, message: Message) -> None:
        self.toolfleet_holding = message.headers[HOLDING_HEADER]


class Published(AmqpLease):
    """An AMQP lease whose copies are recorded instead of published."""

    fail = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.copies: list[tuple[str, str, dict[str, Any]]] = []

    def _broker(self) -> Any:
        lease = self

        class Producer:
            def publish(self, body: Any, **kwargs: Any) -> None:
                if lease.fail:
                    raise ConnectionError("RabbitMQ unreachable")
                lease.copies.append((kwargs["headers"]["id"], body, kwargs))

        class Connection:
            def Producer(self) -> Producer:  # kombu's name
                return Producer()

        return Connection()


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(redis_url: str, settings: Settings) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    for key in c.scan_iter(f"{settings.namespace}:*"):
        c.delete(key)
    c.close()


def lease_of(client: redis.Redis, settings: Settings) -> Published:
    lease = Published(client, settings.key_prefix, "", TTL, 0.1, 60.0)
    lease.tick()  # registered
    return lease


def start(client: redis.Redis, settings: Settings, task: str, request: object) -> Any:
    keys, args = start_args(settings.key_prefix, task, 60, request, "", "")
    return parse_start(client.eval(START_SCRIPT, len(keys), *keys, *args))


def lapse(client: redis.Redis, settings: Settings, lease: AmqpLease) -> None:
    client.zadd(leases_key(settings.key_prefix), {lease.id: 0})


def test_a_vanished_workers_running_call_is_handed_on_as_a_copy_and_the_original_fenced(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a call started under a lease that lapsed, when another worker sweeps, then a
    copy is published with the original's body, headers and properties and a copy id the
    marker names; the copy starts (a redelivery), the original does not, and is dropped
    without an answer."""
    lost, survivor = lease_of(client, settings), lease_of(client, settings)
    original = Message("t1")
    lost.hold(original)
    assert start(client, settings, "t1", Request(original)).starts == 1
    lapse(client, settings, lost)

    assert survivor.sweep() == ["t1"]
    [(task, body, published)] = survivor.copies
    assert task == "t1" and body == original.body.decode()
    assert published["exchange"] == "ns:tools" and published["routing_key"] == "ns:tools"
    assert published["correlation_id"] == "t1" and published["reply_to"] == "r"
    assert HOLDING_HEADER not in published["headers"]
    marker = json.loads(client.get(marker_key(settings.key_prefix, "t1")) or b"{}")
    assert marker["c"] == published["headers"][COPY_HEADER]
    assert CallMarker.parse(json.dumps(marker)).handed_on == lost.id  # type: ignore[union-attr]

    copy = Message("t1", published["headers"])
    survivor.hold(copy)
    began = start(client, settings, "t1", Request(copy))
    assert (began.starts, began.handed_on) == (2, True)

    redelivered = Message("t1")  # RabbitMQ gives the original back, to any worker
    survivor.hold(redelivered)
    refused = start(client, settings, "t1", Request(redelivered))
    assert refused.stale and dropped_unrun(Request(redelivered))
    marker = CallMarker.parse(client.get(marker_key(settings.key_prefix, "t1")))
    assert marker is not None and marker.starts == 2
    assert marker.fence == holding_token(*copy.headers[HOLDING_HEADER])


def test_a_call_another_attempt_started_since_is_not_handed_on(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a delivery held under a lease that lapsed, whose call another worker has
    started since (RabbitMQ gave it back there first), then the sweep publishes nothing."""
    lost, other = lease_of(client, settings), lease_of(client, settings)
    lost.hold(Message("t2"))
    elsewhere = Message("t2")
    other.hold(elsewhere)
    assert start(client, settings, "t2", Request(elsewhere)).starts == 1
    lapse(client, settings, lost)

    assert other.sweep() == []
    assert other.copies == []


def test_a_released_delivery_is_not_handed_on(client: redis.Redis, settings: Settings) -> None:
    """Given a delivery acknowledged (released) before its lease lapsed, then no copy."""
    lease, survivor = lease_of(client, settings), lease_of(client, settings)
    message = Message("t3")
    lease.hold(message)
    lease.release(tuple(message.headers[HOLDING_HEADER]))
    lease.tick()
    lapse(client, settings, lease)
    time.sleep(0.01)

    assert survivor.sweep() == []


def test_a_copy_that_could_not_be_published_leaves_the_original_to_run(
    client: redis.Redis, settings: Settings
) -> None:
    """Given RabbitMQ unreachable from the sweeping worker, then the copy is taken back out
    of the marker, and the original, when RabbitMQ gives it back, starts (a redelivery)."""
    lost, survivor = lease_of(client, settings), lease_of(client, settings)
    original = Message("t4")
    lost.hold(original)
    assert start(client, settings, "t4", Request(original)).starts == 1
    lapse(client, settings, lost)
    survivor.fail = True

    assert survivor.sweep() == []
    marker = json.loads(client.get(marker_key(settings.key_prefix, "t4")) or b"{}")
    assert "c" not in marker
    redelivered = Message("t4")
    survivor.hold(redelivered)
    assert start(client, settings, "t4", Request(redelivered)).starts == 2


def test_a_publisher_cannot_name_a_holding(client: redis.Redis, settings: Settings) -> None:
    """Given a message whose publisher set the holding header, then the consumer's hold
    replaces it with its own."""
    lease = lease_of(client, settings)
    message = Message("t5", {HOLDING_HEADER: ["toolfleet:held:x", "y"]})
    lease.hold(message)
    held, tag = message.headers[HOLDING_HEADER]
    assert held == f"{settings.key_prefix}held:{lease.id}" and tag.startswith("amqp:")
    assert client.hexists(held, tag)


def test_the_calls_of_a_sweeper_that_died_before_publishing_are_handed_on_again(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a sweeper that took a lapsed lease and died before publishing its copies, when
    the handing grace has passed, then another worker's sweep publishes the copy under a
    new copy id, the one the marker names from then on."""
    lost, dead, survivor = (lease_of(client, settings) for _ in range(3))
    original = Message("t6")
    lost.hold(original)
    assert start(client, settings, "t6", Request(original)).starts == 1
    lapse(client, settings, lost)
    dead.fail = True
    dead._done = lambda **_: None  # type: ignore[assignment]  # it dies before finishing
    dead._undo = lambda **_: None  # type: ignore[assignment]
    assert dead.sweep() == []
    first = json.loads(client.get(marker_key(settings.key_prefix, "t6")) or b"{}")["c"]

    assert survivor.sweep() == []  # within the grace: the dead sweeper's
    client.zadd(handing_key(settings.key_prefix), {lost.id: 0})  # the grace is over
    assert survivor.sweep() == ["t6"]
    [(_, _, published)] = survivor.copies
    second = published["headers"][COPY_HEADER]
    assert second != first
    assert json.loads(client.get(marker_key(settings.key_prefix, "t6")) or b"{}")["c"] == second
    assert client.zcard(handing_key(settings.key_prefix)) == 0
