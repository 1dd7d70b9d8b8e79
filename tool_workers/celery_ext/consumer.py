"""The worker's message consumer: no message, whatever its shape, stops the worker.

Every message on a task queue passes :func:`tool_workers.celery_ext.envelope.check_message` before
Celery's task handler sees it. A message Celery could not read safely (a body that is not
``[args, kwargs, embed]``, a ``timelimit`` header that is not a pair, no ``id`` header,
an undecodable body) is acknowledged, logged in one line, and, when it carries a usable
task id, answered with a stored failure the orchestrator turns into an error
ToolMessage. Celery's own handling of invalid messages (refused content, an unknown
task) is kept and answered the same way. Anything Celery's handler still raises for one
message is contained to that message: the worker keeps serving.

A consumer that stops on an error Celery cannot recover from ends the worker (a cold
shutdown, exit status 1) instead of leaving it alive and serving nothing: its lease
lapses at once, so its calls are handed on, and its supervisor (compose's restart
policy, Kubernetes) starts a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from celery.app.task import Context
from celery.exceptions import WorkerShutdown, WorkerTerminate
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from vine import promise

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.envelope import (
    Refusal,
    check_message,
    pin_headers,
    usable_task_id,
)
from tool_workers.celery_ext.event_loop import steady_retries
from tool_workers.celery_ext.fence import (
    EARLY_HEADER,
    HOLDING_HEADER,
    EarlyStart,
    holding_in,
    parse_start,
)
from tool_workers.celery_ext.hand_on import HandOn, NotServed
from tool_workers.celery_ext.transport import QoS as RecordingQoS
from tool_workers.contract.marker import CallMarker, marker_key
from tool_workers.contract.names import tool_from_task
from tool_workers.observability import metrics as worker_metrics

log = logging.getLogger("toolfleet.worker")


class UnreadableCall(Exception):
    """Raised (stored as the call's failure) when a call's message cannot be read."""


_HEART = "celery.worker.consumer.heart:Heart"

EVENTS_FLUSH = 0.5
"""Seconds task events (``-E``) wait to go out together, in one publish."""


class ToolfleetConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, checking each message first and answering the ones it refuses."""

    _events_flush: Any = None
    _hand_on: HandOn | None = None
    _starters: dict[str, Any] = {}  # replaced as the handler is made, never changed

    def on_send_event_buffered(self) -> None:
        """Flush the buffered task events :data:`EVENTS_FLUSH` s after the first of them.

        Celery flushes after each event: a publish, a round trip on the consumer's loop,
        for each of a call's received, started and succeeded events. Together, a call's
        events (and those of calls around it) cost one publish.
        """
        if self.hub is None:
            super().on_send_event_buffered()
            return
        pending = self._events_flush
        if pending is not None and not pending.canceled:
            return  # a reconnect cancels the loop's timers: then schedule anew
        self._events_flush = self.hub.call_later(EVENTS_FLUSH, self._flush_task_events)

    def _flush_task_events(self) -> None:
        self._events_flush = None
        if self.event_dispatcher is not None:
            self.event_dispatcher.flush()

    def start(self) -> None:
        """Consume until the worker stops; an error Celery does not recover from ends
        the worker (cold shutdown, exit status 1) after its lease lapses."""
        try:
            super().start()
        except (WorkerShutdown, WorkerTerminate, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.critical(
                "the consumer stopped (%s: %s): this worker takes no more calls; its lease "
                "lapses now and it exits, for its supervisor to restart it",
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            lease = leases.current()
            if lease is not None:
                lease.expire()
            if self.controller is not None:
                self.controller.exitcode = 1
            raise WorkerTerminate(1) from exc

    def create_task_handler(self, promise: Any = promise) -> Callable[[Any], None]:
        """Celery's task handler, behind the message check and a per-message guard."""
        handle = super().create_task_handler(promise)
        connection_errors = tuple(self.connection_errors or ())
        signed = bool(self.app.conf.get("toolfleet_signed"))
        # Read once: set as the worker is set up, before its consumer starts (Celery's
        # configuration costs microseconds a lookup).
        self._hand_on = self.app.conf.get("toolfleet_hand_on")
        self._starters = self.app.conf.get("toolfleet_early_starts") or {}

        def on_task_received(message: Any) -> None:
            refusal = check_message(message)
            if refusal is not None:
                self._refuse(message, refusal)
                return
            pin_headers(message.headers, signed)
            if self._running_here(message):
                return
            if self._handed_on(message):
                return
            lease = leases.current()
            if lease is not None:
                # RabbitMQ: held under the worker's lease (on Redis, the transport's QoS).
                lease.hold(message)
            self._record(message)
            try:
                handle(message)
            except connection_errors:
                raise  # the consumer reconnects; the message is redelivered
            except Exception as exc:
                headers = message.headers if isinstance(message.headers, dict) else {}
                name = headers.get("task")
                self._refuse(
                    message,
                    Refusal(
                        f"the worker could not accept it ({type(exc).__name__})",
                        usable_task_id(headers.get("id")),
                        name if isinstance(name, str) else None,
                    ),
                )

        return on_task_received

    def on_close(self) -> None:
        """The connection is gone (a reset, a reconnect): Celery forgets the calls it had
        reserved and not started, which RabbitMQ gives back to the queue; their holdings
        under the lease go too, at the lease's next renewal (a pool process that reaches
        one afterwards finds it released, and drops it unrun)."""
        lease = leases.current()
        if lease is not None:
            for request in list(worker_state.reserved_requests):
                if request not in worker_state.active_requests:
                    lease.release(holding_in(request.request_dict.get(HOLDING_HEADER)))
        super().on_close()

    def _record(self, message: Any) -> None:
        """Write the delivery's record as held (Redis); a call that starts at once is
        started in the same round trip (:class:`EarlyStart`)."""
        qos = getattr(message.channel, "qos", None)
        if not isinstance(qos, RecordingQoS) or not qos.pending(message.delivery_tag):
            return
        early = self._early(message)
        reply = qos.record(early if early is not None and early.keys else None)
        if early is None or (early.keys and reply is None):
            return  # the task body admits and starts it
        start = parse_start(reply) if reply is not None else None
        # What the task body needs, on the request Celery makes of these headers.
        message.headers[EARLY_HEADER] = replace(early, keys=(), args=(), start=start)

    def _early(self, message: Any) -> EarlyStart | None:
        """The early start of a delivery the pool runs now: a tool's call with a slot
        free, neither rate-limited, expiring nor revoked; ``None`` otherwise (its task
        body starts it, when it runs)."""
        pool = self.pool
        if pool is None:
            return None
        headers = message.headers  # a dict: check_message refused any other
        name, task_id = headers.get("task"), headers.get("id")
        starter: Any = self._starters.get(name) if isinstance(name, str) else None
        task = self.app.tasks.get(name) if starter is not None else None
        if (
            task is None
            or (task.rate_limit and not self.disable_rate_limits)
            or headers.get("expires")
            or task_id in worker_state.revoked
            or len(worker_state.reserved_requests) >= (getattr(pool, "limit", 0) or 0)
        ):
            return None
        args, kwargs, _ = message.payload
        properties = message.properties if isinstance(message.properties, dict) else {}
        try:
            # The headers as the task body's request shows them (Celery's Context would
            # also sort out its custom headers, which nothing here reads).
            context = SimpleNamespace(
                **{**headers, "reply_to": properties.get("reply_to"), "hostname": self.hostname}
            )
            early: EarlyStart = starter(context, args[0] if args else kwargs.get("request"))
        except Exception:  # its task body admits it again, and answers
            log.exception("could not admit call %s early", usable_task_id(task_id))
            return None
        return early

    def _handed_on(self, message: Any) -> bool:
        """Hand on (or answer) a call this worker does not serve at the version asked
        (:mod:`tool_workers.celery_ext.hand_on`); ``False``: it runs here."""
        hand_on: HandOn | None = self._hand_on
        if hand_on is None:
            return False
        headers = message.headers
        name = headers.get("task")
        tool = tool_from_task(name) if isinstance(name, str) else None
        try:
            queue = hand_on.target(headers)
        except NotServed as exc:
            task_id = usable_task_id(headers.get("id"))
            self._refuse(message, Refusal(str(exc), task_id, name), NotServed)
            return True
        if queue is None:
            return False
        hand_on.forward(self.app, message, queue)
        log.warning(
            "handed call %s of %s on to queue %s (this worker does not serve it)",
            usable_task_id(headers.get("id")) or "unusable",
            _short(name),
            queue,
        )
        metrics = worker_metrics.active()
        if metrics is not None and tool is not None:
            metrics.record(tool, "handed_on", self.hostname, None)
        return True

    def _running_here(self, message: Any) -> bool:
        """Drop (acknowledge) a second delivery of a call this worker is running now.

        RabbitMQ gives back every unacknowledged message of a connection that closed,
        the calls still running on the worker included: after a broker restart or a
        blip the worker reconnects and is handed its own running calls again. The first
        run stores the result (its acknowledgement, on the old channel, is lost), so the
        copy is acknowledged and not run a second time. kombu's Redis transport gives
        them back too (when it closes a lost connection's channels, or after the
        visibility timeout), under their own delivery tag: that copy is the running
        attempt's delivery, left for the attempt to acknowledge.
        """
        task_id = message.headers.get("id")
        request = worker_state.requests.get(task_id)
        if request is None or request not in worker_state.active_requests:
            return False
        if message.headers.get("retries") != request.request_dict.get("retries"):
            # A Celery retry of the running attempt (same task id, the next retry number),
            # sent just before that attempt ends: a new attempt, not a redelivery.
            return False
        if not self._start_recorded(task_id):
            # Redis lost the call's records (a restart without persistence, FLUSHALL, a
            # failover to a replica behind) and the call was published again: the running
            # attempt can no longer store its result, so the copy runs (its start decides,
            # tool_workers.contract.epoch: a non-idempotent call is refused there).
            log.warning(
                "call %s is running on this worker, but Redis lost its start; not dropping "
                "its new delivery",
                task_id,
            )
            return False
        if message.delivery_tag == request.message.delivery_tag and self._tags_unique():
            # Given back under its own delivery tag (kombu's Redis restore after a cut, or
            # its visibility timeout): the running attempt acknowledges that delivery when
            # it ends. Acknowledging it here would drop the attempt's holding, and with it
            # the attempt's right to store its result: the call would go unanswered.
            log.warning(
                "call %s is running on this worker already; dropped its redelivery "
                "(the running attempt acknowledges it)",
                task_id,
            )
            return True
        log.warning("call %s is running on this worker already; dropped its redelivery", task_id)
        message.ack()
        return True

    def _start_recorded(self, task_id: str) -> bool:
        """Whether the call's marker counts a start (the running attempt's, which stores
        the result); ``True`` when Redis cannot be read (the copy is dropped, as before)."""
        prefix = str(self.app.conf.get("toolfleet_key_prefix") or "toolfleet:")
        try:
            raw = self.app.backend.client.get(marker_key(prefix, task_id))
        except Exception as exc:  # unreachable: keep the running attempt's claim
            log.warning("could not read the marker of call %s: %r", task_id, exc)
            return True
        marker = CallMarker.parse(raw)
        return marker is not None and marker.starts > 0

    def _tags_unique(self) -> bool:
        """Whether a delivery tag names one delivery across channels: kombu's Redis
        transport gives each a uuid; AMQP numbers them per channel, so after a reconnect
        a redelivered copy may carry the number of the original on the old channel."""
        connection = self.connection
        return connection is not None and connection.transport.driver_type == "redis"

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]
        # Heartbeats that never stall the event loop (tool_workers.celery_ext.heartbeat).
        default_steps = [
            "tool_workers.celery_ext.heartbeat:Heart" if step == _HEART else step
            for step in Consumer.Blueprint.default_steps
        ]

    def ensure_connected(self, conn: Any) -> Any:
        """Connect, retrying every second (not backing off to 30 s)."""
        return super().ensure_connected(steady_retries(conn))

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A body that does not decode: Celery logs and acks it; answer the call too."""
        super().on_decode_error(message, exc)
        self._answer(message, _unreadable(message, exc))

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """Refused content (pickle, YAML) or an invalid task message: answer the call too."""
        super().on_invalid_task(body, message, exc)
        self._answer(message, _unreadable(message, exc))

    def _refuse(
        self, message: Any, refusal: Refusal, kind: type[Exception] = UnreadableCall
    ) -> None:
        # One line, naming what is wrong; never the body (it may hold secrets).
        log.error(
            "refused a message on the task queue (task %s, id %s): %s",
            _short(refusal.task),
            refusal.task_id or "unusable",
            refusal.reason,
        )
        try:
            message.ack()
        except self.connection_errors:
            raise
        except Exception:  # already acknowledged, or a transport that cannot: nothing to keep
            log.debug("could not acknowledge a refused message", exc_info=True)
        self._answer(message, refusal, kind)

    def _answer(
        self, message: Any, refusal: Refusal, kind: type[Exception] = UnreadableCall
    ) -> None:
        """Store a failure for the refused call, on the reply channel it was sent with."""
        task_id = refusal.task_id
        if task_id is None:
            return
        properties = message.properties if isinstance(message.properties, dict) else {}
        reply_to = properties.get("reply_to")
        request = Context(id=task_id, reply_to=reply_to if isinstance(reply_to, str) else None)
        try:
            self.app.backend.mark_as_failure(
                task_id, kind(refusal.reason), request=request, call_errbacks=False
            )
        except Exception:  # the result store may be down too; the log line stays
            log.exception("could not record the failure of refused call %s", task_id)


def _unreadable(message: Any, exc: Exception) -> Refusal:
    headers = message.headers if isinstance(message.headers, dict) else {}
    name = headers.get("task")
    return Refusal(
        f"the message of this call could not be read ({type(exc).__name__}: {exc}); "
        f"content type {message.content_type!r}",
        usable_task_id(headers.get("id")),
        name if isinstance(name, str) else None,
    )


def _short(value: str | None) -> str:
    # repr: a name from the wire may hold newlines, which would forge log lines.
    text = "unnamed" if value is None else repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
