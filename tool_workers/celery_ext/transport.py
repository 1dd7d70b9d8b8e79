"""The Redis broker transport: drops what is not a message instead of dying on it, and
records the calls a worker holds under its lease.

kombu's Redis channel pops an entry off a queue's list and parses it as a message
envelope (JSON with ``body``, ``properties``, ``headers``) before any consumer sees it.
An entry that is not one (anything a client with Redis access pushes onto the list)
raises there, in the worker's event loop, and the worker exits with ``Unrecoverable
error``. The entry is already off the list, so this channel logs one line and goes on
polling: there is no task id to answer, and nothing to give back.

Its QoS records each delivery in the worker's lease (:mod:`tool_workers.celery_ext.lease`) in the
same round trip where kombu records it as unacknowledged, and leaves alone, when it is
acknowledged, rejected or restored, a delivery the lease says was handed on to another
worker: under the same delivery tag, that message is now the other worker's.

A producer batch opened inside :func:`capturing` sends nothing: it records the Redis
commands each message would be published with, so a caller can send them in a script
of its own (the orchestrator claims and publishes a call in one round trip that way).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from queue import Empty
from time import time
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.fence import HOLDING_HEADER

log = logging.getLogger("toolfleet.worker")


class QoS(kombu_redis.QoS):
    """kombu's Redis ack emulation, with each delivery held under the worker's lease."""

    def append(self, message: Any, delivery_tag: str) -> None:
        """Record ``message`` as unacknowledged, and as held by this worker's lease."""
        lease = leases.current()
        queue = self.channel.connection.delivering if lease is not None else None
        if lease is None or queue is None:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        raw = message._raw
        delivery = message.delivery_info
        headers = message.headers if isinstance(message.headers, dict) else {}
        task_id = headers.get("id")
        channel = self.channel
        pri = channel._get_message_priority(raw, reverse=False)
        queue_key = channel.global_keyprefix + channel._q_for_pri(queue, pri)
        # The copy the sweep queues again, taken before the holding header is set.
        entry = leases.held_entry(str(task_id), raw, [queue_key])
        held = lease.take(delivery_tag, str(task_id))
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time()})
            pipe.hset(
                self.unacked_key,
                delivery_tag,
                json.dumps([raw, delivery["exchange"], delivery["routing_key"]]),
            )
            pipe.hset(_relative(channel, held), delivery_tag, entry)
            pipe.execute()
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]
        if isinstance(message.headers, dict):
            message.headers[HOLDING_HEADER] = [held, delivery_tag]

    def ack(self, delivery_tag: str) -> None:
        """Acknowledge a delivery; one handed on to another worker only here."""
        lease = leases.current()
        if lease is None:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
            return
        self._fenced_remove(lease, delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Reject a delivery; one handed on to another worker is on its queue already."""
        lease = leases.current()
        if lease is None or requeue:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
            return
        self._fenced_remove(lease, delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        """Give a delivery back to its queue, unless it was handed on already."""
        lease = leases.current()
        if lease is not None and not lease.still_holds(_text(tag)):
            lease.forget(_text(tag))
            return
        # Its holdings entry goes in the same transaction (_remove_from_indices).
        super().restore_by_tag(tag, client=client, leftmost=leftmost)  # type: ignore[no-untyped-call]
        if lease is not None:
            lease.forget(_text(tag))

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        pipe = super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[no-untyped-call]
        lease = leases.current()
        held = lease.held_key_of(_text(delivery_tag)) if lease is not None else None
        if held is not None:
            pipe.hdel(_relative(self.channel, held), delivery_tag)
        return pipe

    def _fenced_remove(self, lease: leases.Lease, tag: Any) -> None:
        prefix = self.channel.global_keyprefix or ""
        removed = lease.acknowledge(
            _text(tag), prefix + self.unacked_key, prefix + self.unacked_index_key
        )
        if not removed:
            log.warning("did not acknowledge delivery %s: it was handed on to another worker", tag)


def _relative(channel: Any, key: str) -> str:
    """``key`` without the channel's global prefix (its client adds it back)."""
    prefix = channel.global_keyprefix or ""
    return key[len(prefix) :] if prefix and key.startswith(prefix) else key


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Captured:
    """The Redis commands one message would have been published with."""

    task_id: str
    """The message's task id (its ``id`` header)."""
    commands: list[tuple[str, str, Any]] = field(default_factory=list)
    """``(command, key, value)``, keys with the transport's global key prefix."""


_capture: contextvars.ContextVar[list[Captured] | None] = contextvars.ContextVar(
    "toolfleet_publish_capture", default=None
)


@contextlib.contextmanager
def capturing() -> Iterator[list[Captured]]:
    """Producer batches opened inside record their messages' commands instead of
    sending them (on this transport's channels; others publish as usual, so check
    :func:`can_capture` first)."""
    sink: list[Captured] = []
    token = _capture.set(sink)
    try:
        yield sink
    finally:
        _capture.reset(token)


def can_capture(channel: Any) -> bool:
    """Whether a producer batch on ``channel`` honours :func:`capturing`."""
    return isinstance(channel, Channel)


class _CapturingBatch:
    """Stands in for kombu's Redis publish batch inside :func:`capturing`."""

    _SUPPORTED = ("lpush", "pexpire")

    def __init__(self, channel: Channel, sink: list[Captured]) -> None:
        self.channel = channel
        self._sink = sink
        self._collecting: list[tuple[str, tuple[Any, ...]]] | None = None

    def publish(self, message: Any, **kwargs: Any) -> Any:
        commands: list[tuple[str, tuple[Any, ...]]] = []
        self._collecting = commands
        try:
            publish: Any = self.channel.basic_publish  # kombu leaves it unannotated
            result = publish(message, _publish_batch=self, **kwargs)
        finally:
            self._collecting = None
        captured = Captured(str(message["headers"]["id"]))
        prefix = self.channel.global_keyprefix
        for name, args in commands:
            if name not in self._SUPPORTED or len(args) != 2:
                raise RuntimeError(f"cannot capture the Redis command {name!r}")
            captured.commands.append((name, prefix + str(args[0]), args[1]))
        self._sink.append(captured)
        return result

    def add(self, name: str, *args: Any) -> None:
        if self._collecting is None:
            raise RuntimeError("Redis publish command added outside publication")
        self._collecting.append((name, args))

    def flush(self) -> None:
        """Nothing to send: the caller sends what was captured."""

    def discard(self) -> None:
        self._sink.clear()

    def close(self) -> None:
        """Nothing held."""


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; an entry that is not a message envelope is dropped."""

    QoS = QoS

    def create_publish_batch(self, max_size: int) -> Any:
        """kombu's publish batch, or inside :func:`capturing` one that records."""
        sink = _capture.get()
        if sink is not None:
            return _CapturingBatch(self, sink)
        return super().create_publish_batch(max_size)  # type: ignore[no-untyped-call]

    def _brpop_read(self, **options: Any) -> Any:
        passing = self._passing()
        try:
            return super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        except passing:
            raise
        except Exception as exc:
            _dropped(exc)
            raise Empty() from None

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        passing = self._passing()
        try:
            return super()._get(queue)  # type: ignore[no-untyped-call]
        except passing:
            raise
        except Exception as exc:
            _dropped(exc)
            raise Empty() from None

    def _passing(self) -> tuple[type[BaseException], ...]:
        """What goes on up: "no message", and connection errors (the consumer reconnects).

        kombu counts KeyError among Redis connection errors, and an envelope without
        ``properties`` raises one: here it is a bad entry, and the next read of a broken
        connection fails with a real connection error anyway.
        """
        return (Empty, *(e for e in self.connection_errors if e is not KeyError))


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel

    delivering: str | None = None
    """The queue of the message being delivered (its QoS records where it came from)."""

    def _deliver(self, message: Any, queue: Any) -> Any:
        self.delivering = queue
        try:
            return super()._deliver(message, queue)  # type: ignore[no-untyped-call]
        finally:
            self.delivering = None


def _dropped(exc: Exception) -> None:
    # The type only: the entry itself may hold anything.
    log.error("dropped an entry of a task queue that is not a message (%s)", type(exc).__name__)


def install() -> None:
    """Make ``redis://`` and ``rediss://`` broker URLs use :class:`Transport` in this process.

    Through kombu's scheme aliases rather than Celery's ``broker_transport``, so URLs
    (and the worker's "Connected to redis://..." line) keep their scheme.
    """
    for scheme in ("redis", "rediss"):
        kombu_transport.TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
        # A connection opened earlier in the process resolved the scheme already.
        kombu_transport._transport_cache.pop(scheme, None)
