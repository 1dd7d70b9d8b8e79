"""kombu's private names, in one place.

toolfleet's Redis transport (:mod:`tool_workers.celery_ext.transport`) changes three
steps kombu's Redis transport keeps private: reading a queue entry (an entry that is not
a message must not stop the worker), delivering a message (the lease records which
queue it came from), and removing a delivery from the unacknowledged indices (the
lease's record goes with it). The classes here override exactly those methods and hand
each step to a public hook; the rest of toolfleet overrides the hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

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


class RedisQoS(kombu_redis.QoS):
    """kombu's Redis ack emulation whose index removal goes through :meth:`removing`."""

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        pipe = super()._remove_from_indices(delivery_tag, pipe)  # type: ignore[no-untyped-call]
        self.removing(delivery_tag, pipe)
        return pipe

    def removing(self, delivery_tag: str, pipe: Any) -> None:
        """A delivery leaves kombu's unacknowledged indices (in ``pipe``, a transaction
        kombu runs). Override to remove more in the same transaction."""

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

    def _deliver(self, message: Any, queue: Any) -> Any:
        self.delivering = queue
        try:
            return super()._deliver(message, queue)  # type: ignore[no-untyped-call]
        finally:
            self.delivering = None
