"""kombu's private names, in one place.

toolfleet's Redis transport (:mod:`tool_workers.celery_ext.transport`) changes three
steps kombu's Redis transport keeps private: reading a queue entry (an entry that is not
a message must not stop the worker), delivering a message (the lease records which
queue it came from), and removing a delivery from the unacknowledged indices (the
lease's record goes with it). The classes here override exactly those methods and hand
each step to a public hook; the rest of toolfleet overrides the hooks.

They also work around a kombu bug (5.7) that killed a worker's consumer after a network
cut. Celery tears a lost connection down in two passes (``Connection.collect``, then
``Connection.close``); kombu's ``Transport.close_connection`` stops at the first channel
whose ``close`` raises (one waiting for the reply of its outstanding BRPOP, which never
comes over a cut link), and the first pass detaches the transport from its connection
anyway (``transport.client = None``). The second pass closes the consumer's channel, left
open: restoring its unacknowledged deliveries builds a Redis client from the detached
transport and raises ``AttributeError`` (``conninfo.hostname``), which Celery does not
expect there. Here a channel closes even when that reply never comes, the transport
closes every channel whatever one raises, and a channel closed after its transport was
detached does not reconnect to give back its deliveries (the worker's lease and the
visibility timeout do). ``tests/integration/test_transport_teardown.py`` runs Celery's
teardown on stock kombu too, and fails once kombu no longer needs this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

logger = logging.getLogger("toolfleet.worker")

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "Channel._brpop_read": (kombu_redis.Channel, "_brpop_read", ("self",)),
    "Channel._get": (kombu_redis.Channel, "_get", ("self", "queue")),
    "Channel._get_message_priority": (
        kombu_redis.Channel,
        "_get_message_priority",
        ("self", "message", "reverse"),
    ),
    "Channel._q_for_pri": (kombu_redis.Channel, "_q_for_pri", ("self", "queue", "pri")),
    "QoS._remove_from_indices": (
        kombu_redis.QoS,
        "_remove_from_indices",
        ("self", "delivery_tag", "pipe"),
    ),
    "Transport._deliver": (virtual.Transport, "_deliver", ("self", "message", "queue")),
    "virtual.Message._raw": (virtual.Message, "__init__", ("self", "payload", "channel")),
    "QoS._delivered": (virtual.QoS, "_delivered", ()),
    "kombu.transport._transport_cache": (kombu_transport, "_transport_cache", ()),
}
"""Each private name: (owner, attribute, the leading parameters it must take)."""


def raw_payload(message: Any) -> dict[str, Any]:
    """The envelope a virtual transport's message was read from (kombu keeps it as
    ``_raw``: the unacknowledged copy kombu's own QoS stores)."""
    return message._raw  # type: ignore[no-any-return]


def queue_list_key(channel: Any, queue: str, payload: dict[str, Any]) -> str:
    """The full Redis key of the list ``queue``'s message ``payload`` waits on (its
    priority's list, with the channel's global key prefix)."""
    priority = channel._get_message_priority(payload, reverse=False)
    return str(channel.global_keyprefix + channel._q_for_pri(queue, priority))


def register_transport(scheme: str, path: str) -> None:
    """Make ``scheme://`` URLs use the transport class at ``path`` in this process,
    also where a connection resolved the scheme before (kombu caches it)."""
    kombu_transport.TRANSPORT_ALIASES[scheme] = path
    kombu_transport._transport_cache.pop(scheme, None)


class RedisChannel(kombu_redis.Channel):  # kombu is unannotated
    """kombu's Redis channel whose two queue reads go through :meth:`read`."""

    def _brpop_read(self, **options: Any) -> Any:
        return self.read(lambda: super(RedisChannel, self)._brpop_read(**options))  # type: ignore[no-untyped-call]

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        return self.read(lambda: super(RedisChannel, self)._get(queue))  # type: ignore[no-untyped-call]

    def read(self, fetch: Callable[[], Any]) -> Any:
        """Read a queue entry (``fetch`` pops and delivers it). Override to guard it."""
        return fetch()

    def close(self) -> None:
        """Close the channel, also when the reply of its outstanding BRPOP never comes
        (kombu reads it first; over a cut link the read fails, Celery bounds it)."""
        try:
            super().close()  # type: ignore[no-untyped-call]
        except self.connection_errors:
            if self.closed:
                raise  # closed; only giving back its deliveries failed
            # The BRPOP read failed and kombu dropped its connection: close the rest.
            super().close()  # type: ignore[no-untyped-call]


class RedisQoS(kombu_redis.QoS):
    """kombu's Redis ack emulation whose index removal goes through :meth:`removing`."""

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        pipe = super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[no-untyped-call]
        self.removing(delivery_tag, pipe)
        return pipe

    def removing(self, delivery_tag: str, pipe: Any) -> None:
        """A delivery leaves kombu's unacknowledged indices (in ``pipe``, a transaction
        kombu runs). Override to remove more in the same transaction."""

    def restore_unacked(self, client: Any = None) -> None:
        """Give the unacknowledged deliveries back to their queues, unless the channel's
        transport was detached from its connection (a client built then has no address)."""
        transport = self.channel.connection
        if client is None and (transport is None or transport.client is None):
            # Their records stay in Redis for the lease's sweep or the visibility timeout.
            logger.warning(
                "left %d unacknowledged delivery(ies) to be given back later: their "
                "connection was closed",
                len(self._delivered),
            )
            self._delivered.clear()
            return
        super().restore_unacked(client)  # type: ignore[no-untyped-call]

    def track(self, message: Any, delivery_tag: str) -> None:
        """Only the in-memory part of kombu's ``append`` (the caller wrote Redis)."""
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def untrack(self, delivery_tag: str) -> None:
        """Only the in-memory part of kombu's ``ack`` (the caller wrote Redis)."""
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport that knows which queue it is delivering from."""

    delivering: str | None = None
    """The queue of the message being delivered (its QoS records where it came from)."""

    def close_connection(self, connection: Any) -> None:
        """Close every channel, whatever one of them raises; then raise the first error
        (kombu stops at the first, leaving the rest to be closed once detached)."""
        first: BaseException | None = None
        # Each failed pass has taken the channel that raised off the lists.
        for _ in range(len(self.channels) + 2):
            try:
                super().close_connection(connection)  # type: ignore[no-untyped-call]
            except self.connection_errors + self.channel_errors as exc:
                first = first or exc
                continue
            break
        if first is not None:
            raise first

    def _deliver(self, message: Any, queue: Any) -> Any:
        self.delivering = queue
        try:
            return super()._deliver(message, queue)  # type: ignore[no-untyped-call]
        finally:
            self.delivering = None
            self.delivered()

    def delivered(self) -> None:
        """A delivery's callbacks returned (or raised). Override to finish what its
        consumer left."""


RedisSentinelChannel = kombu_redis.SentinelChannel
"""kombu's channel to the primary that Redis Sentinels name (public in kombu)."""

RedisSentinelTransport = kombu_redis.SentinelTransport
"""kombu's transport for ``sentinel://`` URLs (public in kombu)."""
