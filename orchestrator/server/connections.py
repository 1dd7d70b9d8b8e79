"""Connections before they are requests: a deadline and a size bound for each request
head, and a cap on the connections one replica holds open.

uvicorn reads a request head for as long as the client takes: a connection that sends
half a request line and stops is kept open forever (its keep-alive timer only runs
between requests, and any byte cancels it), and so is one that trickles a header one
byte at a time. A thousand of them exhaust the process's open files, and then nobody,
``/ok`` included, gets an answer. So each connection goes through a thin protocol in
front of uvicorn's own, which watches the same bytes with the same parser (httptools)
and knows when a request head starts and ends::

    connect ------------------ at the cap? --> close the connection waiting longest
                                               for its head; none waits: 503, close
    head started (connect, or the first byte of the next request)
        ... not complete within TOOLFLEET_HTTP_HEADER_TIMEOUT --------> 408, close
        ... larger than MAX_HEAD_BYTES -------------------------------> 431, close
    head complete -> uvicorn and the app (the guard then bounds the body's time)

Nothing of a request reaches the app before its head is complete, so this costs a
request only a second parse of its head and body by a C parser. A connection waiting
for its head is the only kind ever closed to make room: one busy with a request (a
stream, a long ``/wait``) is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools

log = logging.getLogger("toolfleet.server")

MAX_HEAD_BYTES = 65_536
"""Largest request head (request line and headers) read before a 431; the app's own
limits (:mod:`orchestrator.server.guard`) are well below it."""

FIRST_REQUEST_POLL = 0.02
"""Seconds between looks, as a replica stops, for connections still without a request."""

RESERVED_FILES = 100
"""Open files kept for the process's own use beyond its Redis and database pools."""


@dataclass(frozen=True)
class ConnectionLimits:
    """What one replica allows a connection.

    Args:
        header_timeout: Seconds a request head may take, from the connection (or the
            request's first byte) to its last header.
        max_connections: Connections held open at once.
        max_head_bytes: Largest request head.
    """

    header_timeout: float
    max_connections: int
    max_head_bytes: int = MAX_HEAD_BYTES


def _response(status: str, detail: str) -> bytes:
    body = f'{{"detail": "{detail}"}}'.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionGuard:
    """The open connections of one replica, and those waiting for a request head in the
    order they started waiting.

    Args:
        limits: The limits to enforce.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._open: set[GuardedConnection] = set()
        self._waiting: dict[GuardedConnection, None] = {}  # insertion order: oldest first
        self.evicted = 0
        """Connections closed to make room for a new one."""
        self.refused = 0
        """Connections refused (503) at the cap, with none waiting to close instead."""
        self.timed_out = 0
        """Connections closed because a request head took too long or grew too large."""

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._open)

    def admit(self, connection: GuardedConnection) -> bool:
        """Count a new connection in, closing the one waiting longest for its head if
        the cap is reached; ``False``: the cap is reached and none waits."""
        while len(self._open) >= self.limits.max_connections:
            victim = next(iter(self._waiting), None)
            if victim is None:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning(
                        "%d connections open, all busy: refusing new ones (503; %d so far)",
                        len(self._open),
                        self.refused,
                    )
                return False
            self.evicted += 1
            if self.evicted == 1 or self.evicted % 1000 == 0:
                log.warning(
                    "%d connections open: closing those waiting longest for a request "
                    "head to make room (%d so far)",
                    len(self._open),
                    self.evicted,
                )
            self.forget(victim)
            victim.close()
        self._open.add(connection)
        return True

    def waiting(self, connection: GuardedConnection) -> None:
        """The connection waits for a request head (now the newest to)."""
        self._waiting.pop(connection, None)
        self._waiting[connection] = None

    def served(self, connection: GuardedConnection) -> None:
        """The connection's request head is complete."""
        self._waiting.pop(connection, None)

    def forget(self, connection: GuardedConnection) -> None:
        """The connection is gone (or going)."""
        self._open.discard(connection)
        self._waiting.pop(connection, None)

    async def first_requests(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until no connection is waiting for its first
        request head: for a replica that stopped listening, as uvicorn's shutdown closes
        a connection with no request, and a request a load balancer sent just before
        (on a connection accepted, its head still on its way) would be cut unanswered.
        Each such head ends within the head timeout anyway (408 then)."""
        deadline = time.monotonic() + timeout
        while any(c.heads == 0 for c in self._waiting) and time.monotonic() < deadline:
            await asyncio.sleep(FIRST_REQUEST_POLL)

    def protocol_factory(self, inner: Callable[..., asyncio.Protocol]) -> type[GuardedConnection]:
        """A protocol class for ``uvicorn.Config(http=...)``: each connection is
        ``inner``'s (made with the same arguments), behind this guard."""
        guard = self

        class Guarded(GuardedConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(inner(*args, **kwargs), guard)

        return Guarded


class _HeadWatch:
    """httptools' callbacks: where request heads start and end."""

    def __init__(self, connection: GuardedConnection) -> None:
        self.connection = connection

    def on_message_begin(self) -> None:
        self.connection.head_started()

    def on_headers_complete(self) -> None:
        self.connection.head_complete()


class GuardedConnection(asyncio.Protocol):
    """One connection: uvicorn's protocol ``inner``, which gets every byte and event,
    and the deadline and size bound of its request heads.

    Args:
        inner: uvicorn's protocol of this connection.
        guard: The replica's connections.
    """

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.admitted = False
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(
            _HeadWatch(self)
        )
        # As uvicorn's own parser is set up: both must see the same requests (the
        # setting is httptools 0.6.3's; earlier releases behave so without it).
        with contextlib.suppress(AttributeError):
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.in_head = False
        self.head_bytes = 0
        self.heads = 0
        """Request heads completed on this connection."""
        self.deadline: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not registered as asyncio's, but is one).
        self.transport = cast(asyncio.Transport, transport)
        if not self.guard.admit(self):
            self.transport.write(_response("503 Service Unavailable", "too many connections"))
            self.transport.close()
            return
        self.admitted = True
        self.inner.connection_made(transport)
        self.head_started()  # the first head is due from now

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.parser is not None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self.untrack()  # not HTTP/1.1 requests from here: uvicorn's to handle
            except httptools.HttpParserError:
                self.untrack()  # uvicorn's parser refuses it too: 400, and it closes
            if self.in_head:
                self.head_bytes += len(data)
                if self.head_bytes > self.guard.limits.max_head_bytes:
                    self.refuse("431 Request Header Fields Too Large", "request head too large")
                    return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        self.guard.forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    # -- request heads --------------------------------------------------------------------

    def head_started(self) -> None:
        """A request head is due (the connection is new, or a request's first byte
        came): start its deadline, unless one runs already."""
        if self.in_head or self.transport is None:
            return
        self.in_head = True
        self.head_bytes = 0
        self.guard.waiting(self)
        loop = asyncio.get_running_loop()
        timeout = self.guard.limits.header_timeout
        self.deadline = loop.call_later(timeout, self.head_too_slow)

    def head_complete(self) -> None:
        """The request head is in: no deadline until the next one starts."""
        self.in_head = False
        self.heads += 1
        self.cancel_deadline()
        self.guard.served(self)

    def head_too_slow(self) -> None:
        """The deadline passed with the head incomplete."""
        self.deadline = None
        timeout = self.guard.limits.header_timeout
        self.refuse("408 Request Timeout", f"request head not received within {timeout:g} s")

    def refuse(self, status: str, detail: str) -> None:
        """Answer ``status`` (on a connection that has not had a request yet: later, a
        response to an earlier request may still be on its way) and close."""
        self.guard.timed_out += 1
        if self.transport is not None and self.heads == 0:
            self.transport.write(_response(status, detail))
        self.close()

    def untrack(self) -> None:
        """Stop watching this connection's requests."""
        self.parser = None
        self.in_head = False
        self.cancel_deadline()
        self.guard.served(self)

    def cancel_deadline(self) -> None:
        """Stop the head's deadline."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def close(self) -> None:
        """Close the connection (uvicorn's protocol learns it from ``connection_lost``)."""
        self.cancel_deadline()
        self.guard.forget(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def connection_cap(wanted: int, pools: int) -> int:
    """The connections a replica can hold: ``wanted``, within the process's open-file
    limit (raised to its hard limit first, as far as needed), less ``pools`` (Redis and
    database connections) and :data:`RESERVED_FILES`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + pools + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    fitting = max(1, soft - pools - RESERVED_FILES)
    if fitting < wanted:
        log.warning(
            "TOOLFLEET_HTTP_MAX_CONNECTIONS=%d does not fit the open-file limit (%d): "
            "holding at most %d connections",
            wanted,
            soft,
            fitting,
        )
    return min(wanted, fitting)
