"""Live progress of a running call: stream-writer events and heartbeats, sent back as they
happen.

A tool running on a worker writes progress with LangGraph's ``get_stream_writer()`` (or
``runtime.stream_writer``), exactly as it would locally. The worker batches the events
(at most :data:`FLUSH_INTERVAL` apart, in order) and publishes each batch on the reply
channel of the orchestrator that sent the call, which writes them to the run's
``custom`` stream while the tool is still running. :func:`heartbeat` tells the
orchestrator a long, quiet tool is still alive (see the ``idle_timeout`` policy).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import redis

from tool_workers.contract.models import HEARTBEAT, progress_message
from tool_workers.contract.wire_json import NotJSONError, to_wire

log = logging.getLogger("toolfleet.worker")

FLUSH_INTERVAL = 0.1
"""Seconds at most between a progress event and its publication."""


_current: ContextVar[ProgressPublisher | None] = ContextVar("toolfleet_progress", default=None)


class ProgressPublisher:
    """Batches one call's events and publishes them on its orchestrator's reply channel."""

    def __init__(self, client: redis.Redis, channel: str, task_id: str) -> None:
        self._client = client
        self._channel = channel
        self._task_id = task_id
        self._lock = threading.Lock()
        self._events: list[Any] = []
        self._seq = 0
        self._timer: threading.Timer | None = None
        self._closed = False

    def write(self, event: Any) -> None:
        """Queue one event (the stream writer a tool gets)."""
        try:
            data = to_wire(event, "progress event")
        except NotJSONError as exc:
            log.warning("progress event of call %s sent as text: %s", self._task_id, exc)
            data = repr(event)
        with self._lock:
            if self._closed:
                return
            self._events.append(data)
            if self._timer is None:
                self._timer = threading.Timer(FLUSH_INTERVAL, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def heartbeat(self) -> None:
        """Tell the orchestrator the call is alive."""
        self.write(HEARTBEAT)

    def flush(self) -> None:
        """Publish what is queued now."""
        with self._lock:
            events, self._events = self._events, []
            self._timer = None
            if not events:
                return
            self._seq += 1
            message = json.dumps(progress_message(self._task_id, self._seq, events))
            # Published under the lock: batches leave in the order they were made.
            try:
                self._client.publish(self._channel, message)
            except redis.RedisError as exc:  # progress is best effort; the result is not
                log.warning("could not publish progress of call %s: %r", self._task_id, exc)

    def close(self) -> None:
        """Publish the rest; later writes are dropped."""
        with self._lock:
            timer = self._timer
        if timer is not None:
            timer.cancel()
        self.flush()
        with self._lock:
            self._closed = True


@contextmanager
def publishing(publisher: ProgressPublisher | None) -> Iterator[None]:
    """Make ``publisher`` the running call's (for :func:`heartbeat`); close it afterwards."""
    token = _current.set(publisher)
    try:
        yield
    finally:
        _current.reset(token)
        if publisher is not None:
            publisher.close()


def heartbeat() -> None:
    """Tell the orchestrator the current call is still working (no-op outside a call).

    A call with an ``idle_timeout`` policy that reports nothing (no stream-writer event,
    no heartbeat) for that long is treated as hung: its task is revoked and the model
    gets an error.
    """
    publisher = _current.get()
    if publisher is not None:
        publisher.heartbeat()
