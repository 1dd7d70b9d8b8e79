"""A call's task message, as Celery's own client would publish it.

A tool call is one message of Celery's task protocol 2 (documented in Celery's
*Message Protocol*): headers naming the task, its id and the call's line for Flower
(``kwargsrepr``), properties naming the reply channel, and a JSON body ``[args, kwargs,
embed]`` whose one argument is the :class:`~tool_workers.contract.models.ToolRequest`.
:func:`task_message` builds it without going through a Celery app: it is pure
and cheap. Each header it sends has the value ``app.amqp.create_task_message`` gives;
the headers it leaves out are the optional ones Celery's worker reads with a default
(:data:`LEFT_OUT`), so a message costs a third fewer bytes on each of its three trips
(``tests/unit/test_envelope_build.py`` compares the two field by field).

On a Redis broker the message is pushed onto the queue's list by the publisher's script,
in the envelope kombu's Redis transport reads (:func:`redis_envelope`): the same one
kombu writes, except that the body is JSON text instead of base64 (kombu reads a body
without ``body_encoding`` as it is). On RabbitMQ it goes through a kombu producer.

Celery's ``before_task_publish`` and ``after_task_publish`` signals are sent around each
publication when something listens (OpenTelemetry's Celery instrumentation starts its
publish span there and writes its ``traceparent`` into the headers).
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from celery import signals

from orchestrator.call import PreparedCall
from orchestrator.tracing import message_headers
from tool_workers.contract.epoch import EPOCH_HEADER
from tool_workers.contract.names import VERSION_HEADER, task_name
from tool_workers.contract.signing import sign_request

LEFT_OUT = frozenset(
    {
        "argsrepr",
        "shadow",
        "eta",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
    }
)
"""Celery's protocol 2 headers a call's message leaves out: each is unset for a tool call
(no ETA, group, parent, stamps; the task's own time limits; the first try; the result
kept; the arguments' line, which the worker writes masked), and Celery's worker reads
each with that default (``expires`` too, sent only with a deadline)."""

EMBED: dict[str, Any] = {}
"""The third item of a protocol 2 body: a tool call has no callbacks, chain or chord (the
worker reads each of them with a default)."""


class _Tags:
    """Delivery tags unique across processes and hosts: a random prefix per process and a
    counter (kombu's own are uuid4s: a system call each)."""

    def __init__(self) -> None:
        self._pid = 0
        self._prefix = ""
        self._count = itertools.count()

    def next(self) -> str:
        if self._pid != os.getpid():  # a forked child starts its own series
            self._pid = os.getpid()
            self._prefix = uuid.uuid4().hex[:20]
            self._count = itertools.count()
        return f"{self._prefix}.{next(self._count)}"


_TAGS = _Tags()


@dataclass(slots=True)
class TaskMessage:
    """One call's task message: Celery protocol 2 headers, properties and body."""

    name: str
    """The task name, ``tools.<tool>``."""
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: list[Any]
    """``[args, kwargs, embed]``."""


def task_message(
    call: PreparedCall, reply_to: str, signing_key: str | None = None, epoch: str = ""
) -> TaskMessage:
    """The task message of ``call``, answered on ``reply_to``.

    Args:
        call: The call.
        reply_to: The channel the worker reports the call's states on.
        signing_key: ``TOOLFLEET_SIGNING_KEY``: the request is signed with it.
        epoch: The epoch of toolfleet's records the publisher knows (``""``: none), named
            in the :data:`~tool_workers.contract.epoch.EPOCH_HEADER` and, with a signing
            key, covered by the request's signature.
    """
    name = task_name(call.tool)
    request = call.request().to_wire()
    if signing_key:
        # What decides whether and when the call runs is signed with it: a worker refuses
        # a replay older than the redelivery window, and one past the run's deadline.
        request["issued_at"] = round(time.time(), 3)
        if call.expires_at is not None:
            request["expires_at"] = call.expires_at
        request = sign_request(signing_key, call.task_id, name, request, epoch)
    expires = (
        datetime.datetime.fromtimestamp(call.expires_at, tz=datetime.UTC).isoformat()
        if call.expires_at is not None
        else None
    )
    headers: dict[str, Any] = {
        "lang": "py",
        "task": name,
        "id": call.task_id,
        # Flower's kwargs column and the worker log name the call and where it went; the
        # worker shows the arguments, masked, as the args column (argsrepr: left out).
        "kwargsrepr": (
            f"({call.tool} call={call.call_id} thread={call.thread_id or '-'} "
            f"queue={call.queue or '-'})"
        ),
    }
    if call.spec is not None:
        # The schema the model was shown: a worker serving another one hands the call on.
        headers[VERSION_HEADER] = call.spec.version
    if expires is not None:
        headers["expires"] = expires
    if epoch:
        headers[EPOCH_HEADER] = epoch
    if call.trace is not None:
        # The W3C trace headers: Celery's OpenTelemetry instrumentation on the worker
        # takes its parent from them.
        headers.update(message_headers(call.trace))
    properties = {"reply_to": reply_to}
    return TaskMessage(name, headers, properties, [[request], {}, EMBED])


def redis_envelope(message: TaskMessage, queue: str) -> str:
    """The message as kombu's Redis transport keeps it on the list ``queue`` (JSON text).

    Addressed to the default exchange with the queue as routing key, as Celery addresses
    a message routed by queue: kombu gives it back to that queue when it restores it.
    """
    return json.dumps(
        {
            "body": json.dumps(message.body, separators=(",", ":")),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": message.headers,
            "properties": {
                **message.properties,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "delivery_tag": _TAGS.next(),
            },
        },
        separators=(",", ":"),
    )


def before_publish(message: TaskMessage, queue: str) -> None:
    """Celery's ``before_task_publish``, when anything listens (it may add headers)."""
    if signals.before_task_publish.receivers:
        signals.before_task_publish.send(
            sender=message.name,
            body=message.body,
            exchange="",
            routing_key=queue,
            declare=[],
            headers=message.headers,
            properties=message.properties,
            retry_policy=None,
        )


def after_publish(message: TaskMessage, queue: str) -> None:
    """Celery's ``after_task_publish``, when anything listens."""
    if signals.after_task_publish.receivers:
        signals.after_task_publish.send(
            sender=message.name,
            body=message.body,
            headers=message.headers,
            exchange="",
            routing_key=queue,
        )
