"""A second delivery of a call this worker is running now is dropped; on Redis it is left
for the running attempt to acknowledge (the same delivery, given back under its tag)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state as worker_state

from tool_workers.celery_ext.consumer import ToolfleetConsumer


class Message:
    def __init__(self, task_id: str, tag: Any) -> None:
        self.headers = {"id": task_id, "retries": 0}
        self.delivery_tag = tag
        self.acks = 0

    def ack(self) -> None:
        self.acks += 1


class Request:
    """What the check reads of Celery's request of the running attempt."""

    def __init__(self) -> None:
        self.id = "call-1"
        self.request_dict = {"retries": 0}
        self.message = Message("call-1", "tag-1")


@pytest.fixture
def running() -> Iterator[Request]:
    request = Request()
    worker_state.requests["call-1"] = request
    worker_state.active_requests.add(request)
    try:
        yield request
    finally:
        worker_state.requests.pop("call-1", None)
        worker_state.active_requests.discard(request)


class Markers:
    """The result backend's Redis client as the check reads it: call markers by key."""

    def __init__(self, starts: int | None) -> None:
        self.starts = starts

    def get(self, key: str) -> bytes | None:
        assert key.endswith("call-1"), key
        return None if self.starts is None else json.dumps({"n": self.starts}).encode()


def consumer(driver: str, starts: int | None = 1) -> ToolfleetConsumer:
    """A consumer on ``driver`` whose Redis records ``starts`` starts of call-1 (``None``:
    its marker is gone)."""
    instance = object.__new__(ToolfleetConsumer)
    instance.connection = SimpleNamespace(transport=SimpleNamespace(driver_type=driver))
    instance.app = SimpleNamespace(conf={}, backend=SimpleNamespace(client=Markers(starts)))
    return instance


def test_on_redis_the_copy_under_the_running_deliverys_tag_is_not_acknowledged(
    running: Request,
) -> None:
    """Given a call running under delivery tag-1 on Redis, when kombu gives it back under
    tag-1 (after a cut), then the copy is dropped unacknowledged: acknowledging it would
    remove the running attempt's holding, and its result would be refused."""
    copy = Message("call-1", "tag-1")
    assert consumer("redis")._running_here(copy)
    assert copy.acks == 0


def test_on_amqp_the_copy_is_acknowledged_whatever_its_tag(running: Request) -> None:
    """Given a call running on RabbitMQ, when its copy comes on a new channel (whose tags
    start again at 1, so it may carry the same number), then the copy is acknowledged."""
    copy = Message("call-1", "tag-1")
    assert consumer("amqp")._running_here(copy)
    assert copy.acks == 1


def test_on_redis_a_copy_under_another_tag_is_acknowledged(running: Request) -> None:
    copy = Message("call-1", "tag-2")
    assert consumer("redis")._running_here(copy)
    assert copy.acks == 1


@pytest.mark.parametrize("starts", [None, 0])
def test_a_copy_of_a_running_call_whose_start_redis_lost_is_not_dropped(
    running: Request, starts: int | None
) -> None:
    """Given a call running here whose marker Redis lost (or holds no start), when a copy
    of it comes, then the copy is not dropped: the running attempt can no longer store its
    result, so the copy's own start decides whether it runs."""
    copy = Message("call-1", "tag-2")
    assert not consumer("redis", starts)._running_here(copy)
    assert copy.acks == 0
