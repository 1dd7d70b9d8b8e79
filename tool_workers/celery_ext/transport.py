"""The Redis broker transport: drops what is not a message instead of dying on it, and
records the calls a worker holds under its lease.

kombu's Redis channel pops an entry off a queue's list and parses it as a message
envelope (JSON with ``body``, ``properties``, ``headers``) before any consumer sees it.
An entry that is not one (anything a client with Redis access pushes onto the list)
raises there, in the worker's event loop, and the worker exits with ``Unrecoverable
error``. The entry is already off the list, so this channel logs one line and goes on
polling: there is no task id to answer, and nothing to give back.

Its QoS records each delivery in the worker's lease (:mod:`tool_workers.celery_ext.lease`)
in the same round trip where kombu records it as unacknowledged. The round trip goes once
the consumer has read the message (before anything else the QoS sends), so that a call
the worker runs at once is started in it too
(:class:`tool_workers.celery_ext.fence.EarlyStart`). The QoS leaves alone, when
it is acknowledged, rejected or restored, a delivery the lease says was handed on to
another worker: under the same delivery tag, that message is now the other worker's. A
delivery the store of its result acknowledged already (:mod:`tool_workers.celery_ext.backend`)
costs its acknowledgement no round trip.

When the link is lost, Celery's consumer tears the connection down in two passes (kombu's
``Connection.collect``, then ``Connection.close``). kombu closes the channels of the first
pass one after the other and stops at the first that raises; the usual one is a channel
draining the reply of its outstanding BRPOP, which cannot come over a cut link. The first
pass then detaches the transport from its connection anyway, and the second closes the
channels left open: the consumer's, whose restore of its unacknowledged deliveries builds
a Redis client from the detached transport and raises ``AttributeError``, which Celery
does not expect there: the consumer died (``Unrecoverable error``) while the worker's
other threads lived on. The classes of :mod:`tool_workers.compat.kombu` this transport
builds on close every channel of a lost connection (the workaround, pinned by a test of
kombu's own behaviour); a delivery that could not be given back then is the lease's
sweep's, or kombu's visibility timeout's.

kombu keeps the steps changed here private: they go through the hooks of
:mod:`tool_workers.compat.kombu`.
"""

from __future__ import annotations

import json
import logging
from queue import Empty
from time import time
from typing import Any

from redis.exceptions import NoScriptError

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.fence import HOLDING_HEADER, START_SCRIPT, START_SHA, EarlyStart
from tool_workers.compat.kombu import (
    RedisChannel,
    RedisQoS,
    RedisSentinelChannel,
    RedisSentinelTransport,
    RedisTransport,
    queue_list_key,
    raw_payload,
    register_transport,
)

log = logging.getLogger("toolfleet.worker")


class QoS(RedisQoS):
    """kombu's Redis ack emulation, with each delivery held under the worker's lease."""

    _pipeline: Any = None
    _pending: str | None = None
    """The delivery whose record waits in :attr:`_pipeline` (:meth:`record`)."""

    def append(self, message: Any, delivery_tag: str) -> None:
        """Note ``message`` as unacknowledged, and as held by this worker's lease: its
        record goes to Redis at :meth:`record`, before anything else this QoS sends."""
        self.record()
        lease = leases.current()
        queue = self.channel.connection.delivering if lease is not None else None
        if lease is None or queue is None:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        raw = raw_payload(message)
        delivery = message.delivery_info
        headers = message.headers if isinstance(message.headers, dict) else {}
        task_id = str(headers.get("id"))
        channel = self.channel
        held = lease.take(delivery_tag, task_id)
        entry = leases.held_entry(task_id, queue_list_key(channel, queue, raw))
        # One round trip, no transaction: kombu's own scans skip a delivery younger than
        # the visibility timeout, and the sweep one whose unacked record is not there yet.
        # The pipeline is kept (redis-py copies its reply callbacks into each new one);
        # deliveries are recorded one at a time, from the consumer's loop.
        with channel.conn_or_acquire() as client:
            pipe = self._pipeline
            if pipe is None or pipe.connection_pool is not client.connection_pool:
                pipe = self._pipeline = client.pipeline(transaction=False)
            pipe.zadd(self.unacked_index_key, {delivery_tag: time()})
            pipe.hset(
                self.unacked_key,
                delivery_tag,
                json.dumps(
                    [raw, delivery["exchange"], delivery["routing_key"]], separators=(",", ":")
                ),
            )
            pipe.hset(_relative(channel, held), delivery_tag, entry)
        self._pending = delivery_tag
        channel.connection.recording = self
        self.track(message, delivery_tag)
        if isinstance(message.headers, dict):
            message.headers[HOLDING_HEADER] = [held, delivery_tag]

    def pending(self, delivery_tag: str) -> bool:
        """Whether the record of ``delivery_tag`` waits to be written (:meth:`record`)."""
        return self._pending == delivery_tag

    def record(self, start: EarlyStart | None = None) -> Any:
        """Write the waiting delivery's record (the consumer does, once it has read the
        message; anything else this QoS sends writes it first), and run ``start``'s
        start script in the same round trip. The start's reply, or ``None`` when it did
        not run (nothing waited, or the server did not know the script yet: it knows it
        now, and the task body starts the call)."""
        tag, self._pending = self._pending, None
        if tag is None:
            return None
        pipe = self._pipeline
        prefix = self.channel.global_keyprefix or ""
        if start is not None and not start.keys[0].startswith(prefix):
            start = None  # its client would prefix the marker's key wrongly
        if start is not None:
            # kombu's prefixing client prefixes only the first key of an EVALSHA.
            first, *rest = start.keys
            pipe.evalsha(START_SHA, len(start.keys), first[len(prefix) :], *rest, *start.args)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[:-1] if start is not None else replies:
            if isinstance(reply, Exception):
                raise reply
        if start is None:
            return None
        reply = replies[-1]
        if isinstance(reply, NoScriptError):
            with self.channel.conn_or_acquire() as client:
                client.script_load(START_SCRIPT)
            return None
        if isinstance(reply, Exception):
            log.warning("could not start delivery %s with its record: %r", tag, reply)
            return None
        return reply

    def ack(self, delivery_tag: str) -> None:
        """Acknowledge a delivery; one handed on to another worker only here."""
        self.record()
        lease = leases.current()
        if lease is None:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
            return
        tag = _text(delivery_tag)
        if leases.taken_by_store(tag):
            # Acknowledged with its result, in the store's round trip (backend.py).
            lease.settle(tag)
        else:
            self._fenced_remove(lease, delivery_tag)
        self.untrack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Reject a delivery; one handed on to another worker is on its queue already."""
        self.record()
        lease = leases.current()
        if lease is None or requeue:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
            return
        self._fenced_remove(lease, delivery_tag)
        self.untrack(delivery_tag)

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        """Give a delivery back to its queue, unless it was handed on already."""
        self.record()
        lease = leases.current()
        if lease is not None and not lease.still_holds(_text(tag)):
            lease.forget(_text(tag))
            return
        # Its holdings entry goes in the same transaction (removing()).
        super().restore_by_tag(tag, client=client, leftmost=leftmost)  # type: ignore[no-untyped-call]
        if lease is not None:
            lease.forget(_text(tag))

    def removing(self, delivery_tag: str, pipe: Any) -> None:
        """The lease's record of the delivery goes with kombu's."""
        lease = leases.current()
        held = lease.held_key_of(_text(delivery_tag)) if lease is not None else None
        if held is not None:
            pipe.hdel(_relative(self.channel, held), delivery_tag)

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


class Channel(RedisChannel):
    """kombu's Redis channel; an entry that is not a message envelope is dropped."""

    QoS = QoS

    def read(self, fetch: Any) -> Any:
        """Read a queue entry; one that is not a message is dropped with one log line."""
        passing = self._passing()
        try:
            return fetch()
        except passing:
            raise
        except Exception as exc:
            # The type only: the entry itself may hold anything.
            log.error(
                "dropped an entry of a task queue that is not a message (%s)", type(exc).__name__
            )
            raise Empty() from None

    def _passing(self) -> tuple[type[BaseException], ...]:
        """What goes on up: "no message", and connection errors (the consumer reconnects).

        kombu counts KeyError among Redis connection errors, and an envelope without
        ``properties`` raises one: here it is a bad entry, and the next read of a broken
        connection fails with a real connection error anyway.
        """
        return (Empty, *(e for e in self.connection_errors if e is not KeyError))


class Transport(RedisTransport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel
    recording: QoS | None = None
    """The QoS whose delivery's record waits (:meth:`QoS.record`)."""

    def delivered(self) -> None:
        """The delivery's record is written by the time its callbacks return, whatever
        they did (the consumer writes it sooner, with the call's start)."""
        qos, self.recording = self.recording, None
        if qos is not None:
            qos.record()


class SentinelChannel(Channel, RedisSentinelChannel):
    """:class:`Channel` to the primary the Sentinels name (found again after a failover:
    the consumer reconnects, and kombu asks the Sentinels)."""


class SentinelTransport(Transport, RedisSentinelTransport):
    """kombu's Sentinel transport with :class:`SentinelChannel`."""

    Channel = SentinelChannel


def install() -> None:
    """Make ``redis://``, ``rediss://`` and ``sentinel://`` broker URLs use this module's
    transports in this process.

    Through kombu's scheme aliases rather than Celery's ``broker_transport``, so URLs
    (and the worker's "Connected to redis://..." line) keep their scheme.
    """
    for scheme in ("redis", "rediss"):
        register_transport(scheme, f"{__name__}:Transport")
    register_transport("sentinel", f"{__name__}:SentinelTransport")
