"""The Redis broker transport, dropping what is not a message instead of dying on it.

kombu's Redis channel pops an entry off a queue's list and parses it as a message
envelope (JSON with ``body``, ``properties``, ``headers``) before any consumer sees it.
An entry that is not one (anything a client with Redis access pushes onto the list)
raises there, in the worker's event loop, and the worker exits with ``Unrecoverable
error``. The entry is already off the list, so this channel logs one line and goes on
polling: there is no task id to answer, and nothing to give back.
"""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis

log = logging.getLogger("toolfleet.worker")


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; an entry that is not a message envelope is dropped."""

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
