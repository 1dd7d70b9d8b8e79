"""Publish tool calls onto the broker at most once each.

A call is claimed with ``SET <prefix>sent:<task id> pending NX`` before it is published
and the marker becomes ``sent`` once the broker has the message. Whoever fails to claim
a call attaches to it instead of publishing it again: another Send task of the same
fan-out, another orchestrator process, or this one resuming after a crash. A process
that dies between claiming and publishing leaves a ``pending`` marker that expires after
:data:`PENDING_MARKER_TTL`, after which a waiter claims and publishes the call itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import redis
from celery import Celery

from orchestrator.calls import PreparedCall
from tool_workers.protocol import call_marker_key, task_name
from tool_workers.settings import Settings
from tool_workers.signing import sign_request

log = logging.getLogger("toolfleet.dispatch")

PENDING_MARKER_TTL = 60
"""Seconds a claim lives before its publication is confirmed."""

CLAIM_RETRY_SECONDS = 10.0
"""How long claiming retries while Redis is unreachable (a restart) before giving up."""


class Publisher:
    """Claims and publishes calls through one Celery app and one Redis client."""

    def __init__(
        self, app: Celery, settings: Settings, client: redis.Redis, reply_to: str | None = None
    ) -> None:
        self.app = app
        self._reply_to = reply_to or app.thread_oid
        self._client = client
        self._prefix = settings.key_prefix
        self._expires = settings.result_expires
        self._signing_key = settings.signing_key
        self._sender = app.amqp.send_task_message

    def publish(self, calls: Sequence[PreparedCall]) -> list[PreparedCall]:
        """Publish every call nobody has claimed yet; returns the others (attached to).

        Raises:
            redis.RedisError, kombu's OperationalError: the broker refused the messages
                (the claims are released, so a later attempt can publish them).
        """
        mine = self._claim(calls)
        if len(mine) < len(calls):
            log.info("%d call(s) already dispatched; attaching", len(calls) - len(mine))
        claimed = {c.task_id for c in mine}
        attached = [c for c in calls if c.task_id not in claimed]
        if not mine:
            return attached
        try:
            self._send(mine)
        except Exception:
            self._release(mine)
            raise
        with self._client.pipeline(transaction=False) as pipe:
            for call in mine:
                pipe.set(self._marker(call), "sent", ex=self._expires)
            pipe.execute()
        return attached

    def abandoned(self, call: PreparedCall) -> bool:
        """True when ``call`` has neither a claim nor a result: nobody will publish it."""
        key = self.app.backend.get_key_for_task(call.task_id)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.exists(self._marker(call))
            pipe.exists(key)
            marker, result = pipe.execute()
        return not marker and not result

    def _marker(self, call: PreparedCall) -> str:
        return call_marker_key(self._prefix, call.task_id)

    def _claim(self, calls: Sequence[PreparedCall]) -> list[PreparedCall]:
        deadline = time.monotonic() + CLAIM_RETRY_SECONDS
        delay = 0.1
        while True:
            try:
                with self._client.pipeline(transaction=False) as pipe:
                    for call in calls:
                        pipe.set(self._marker(call), "pending", nx=True, ex=PENDING_MARKER_TTL)
                    claimed = pipe.execute()
                return [c for c, ok in zip(calls, claimed, strict=True) if ok]
            except (redis.ConnectionError, redis.TimeoutError):
                # Nothing was published yet, so trying again is safe.
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("Redis unreachable while dispatching; retrying in %.1fs", delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _send(self, calls: Sequence[PreparedCall]) -> None:
        amqp = self.app.amqp
        # One producer and one Redis pipeline for the whole fan-out.
        with self.app.producer_or_acquire() as producer, producer.batch():
            for call in calls:
                name = task_name(call.tool)
                options = amqp.router.route(
                    {"queue": call.queue} if call.queue else {}, name, (), {}
                )
                body = call.request().model_dump(mode="json")
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
                self._sender(producer, name, message, **options)

    def _release(self, calls: Sequence[PreparedCall]) -> None:
        try:
            self._client.delete(*[self._marker(call) for call in calls])
        except redis.RedisError:  # the claims expire on their own
            log.warning("could not release %d claim(s)", len(calls))


def _argsrepr(call: PreparedCall) -> str:
    # Flower and logs show which call this is, never the arguments (secrets, size).
    return f"({call.tool} call={call.call_id} thread={call.thread_id or '-'})"
