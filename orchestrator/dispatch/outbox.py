"""The broker side of publishing: a publisher's own connections, and the messages of calls.

Every call is one Celery task message, built by Celery and kombu as usual (routing,
the task protocol, signing, trace headers). The outbox either sends the messages of a
fan-out through one producer batch (one pipeline), or *builds* them without sending: a
batch opened inside :func:`tool_workers.celery_ext.transport.capturing` records the Redis commands
each message would be published with, so the publisher can send them in its one-script
claim-and-push.

Building happens on one producer kept for it. Its first use connects, and the first
message for a queue declares that queue on its connection (kombu remembers the
declaration); after that, building a message for a queue seen before is CPU only, which
is what lets an async caller build on its event loop (:meth:`Outbox.built_before`).

The connections are the outbox's own, closed by :meth:`Outbox.close`: Celery's producer
pool is kombu's process-wide one, shared by every app with the same broker URL, so it
could neither be closed here nor be relied on to close.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery
from kombu.entity import Queue
from kombu.pools import ProducerPool

from orchestrator.calls import PreparedCall
from orchestrator.tracing import message_headers, publishing
from tool_workers.celery_ext.transport import Captured, can_capture, capturing
from tool_workers.contract.names import task_name
from tool_workers.contract.settings import Settings
from tool_workers.contract.signing import sign_request


class Busy(Exception):
    """Raised when a build that must not wait finds another one in progress."""


class Outbox:
    """Builds and sends the task messages of calls through connections of its own."""

    def __init__(self, app: Celery, settings: Settings, reply_to: str) -> None:
        """
        Args:
            app: The Celery app whose routing and task protocol the messages follow.
            settings: Supply the signing key.
            reply_to: The channel workers report the calls' states on.
        """
        self.app = app
        self._reply_to = reply_to
        self._signing_key = settings.signing_key
        self._sender = app.amqp.send_task_message
        limit = app.conf.broker_pool_limit or 10
        self._connections: Any = app.connection_for_write().Pool(limit=limit)
        self._producers: Any = ProducerPool(  # type: ignore[no-untyped-call]  # kombu
            self._connections, limit=limit
        )
        self._lock = threading.Lock()
        self._builder: Any = None
        """The producer messages are built on (kept until :meth:`close`)."""
        self._built_for: set[str] = set()
        """Queues a message was built for (declared on the builder's connection)."""
        self._routes: dict[tuple[str, str | None], dict[str, Any]] = {}
        """Routing options by tool and queue (the app's routes do not change)."""

    def send(self, calls: Sequence[PreparedCall]) -> None:
        """Publish the calls' messages, in one producer batch.

        Raises:
            redis.RedisError, kombu's OperationalError: the broker refused them.
        """
        with self._producers.acquire(block=True) as producer:
            self._send_on(producer, calls)

    def build(self, calls: Sequence[PreparedCall], *, wait: bool = True) -> list[Captured] | None:
        """The Redis commands that would publish the calls' messages (nothing is sent);
        ``None`` when the broker's channel cannot hand them over (not Redis).

        Raises:
            Busy: ``wait`` is false and another thread is building (an event loop must
                not wait for it: that one may be connecting or declaring a queue).
        """
        if not self._lock.acquire(blocking=wait):
            raise Busy("the outbox is building another batch")
        try:
            if self._builder is None:
                self._builder = self._producers.acquire(block=True)
            producer = self._builder
            with capturing() as captured:
                if not self._send_on(producer, calls, only_if=can_capture):
                    return None
            self._built_for.update(self._queue_of(call) for call in calls)
        finally:
            self._lock.release()
        return captured

    def built_before(self, calls: Sequence[PreparedCall]) -> bool:
        """Whether every queue the calls go to had a message built before: building
        theirs now does no I/O."""
        with self._lock:
            built = set(self._built_for)
        return all(self._queue_of(call) in built for call in calls)

    def close(self) -> None:
        """Close the outbox's broker connections."""
        self._producers.force_close_all()
        self._connections.force_close_all()

    def _send_on(
        self,
        producer: Any,
        calls: Sequence[PreparedCall],
        only_if: Callable[[Any], bool] | None = None,
    ) -> bool:
        """Publish the calls through ``producer`` (False, and nothing sent, when
        ``only_if`` refuses its channel)."""
        amqp = self.app.amqp
        # One Redis pipeline for the whole fan-out.
        with producer.batch():
            if only_if is not None and not only_if(producer.channel):
                return False
            for call in calls:
                name = task_name(call.tool)
                body = call.request().to_wire()
                if self._signing_key:
                    body = sign_request(self._signing_key, call.task_id, name, body)
                message = amqp.create_task_message(
                    call.task_id,
                    name,
                    (body,),
                    {},
                    reply_to=self._reply_to,
                    argsrepr=_argsrepr(call),
                    kwargsrepr="{}",
                )
                with publishing(call.trace):
                    self._sender(
                        producer,
                        name,
                        message,
                        headers=message_headers(call.trace),
                        **self._route(call),
                    )
        return True

    def _route(self, call: PreparedCall) -> dict[str, Any]:
        """Celery's routing options of the call's task (the same for every call of a tool
        to a queue: worked out once)."""
        key = (call.tool, call.queue)
        options = self._routes.get(key)
        if options is None:
            options = self.app.amqp.router.route(
                {"queue": call.queue} if call.queue else {}, task_name(call.tool), (), {}
            )
            self._routes[key] = options
        return options

    def _queue_of(self, call: PreparedCall) -> str:
        queue = self._route(call).get("queue")
        return str(queue.name if isinstance(queue, Queue) else queue)


def _argsrepr(call: PreparedCall) -> str:
    # Flower and logs show which call this is, never the arguments (secrets, size).
    return f"({call.tool} call={call.call_id} thread={call.thread_id or '-'})"
