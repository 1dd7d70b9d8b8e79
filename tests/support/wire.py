"""Hand-made messages on a fleet's task queue, and what the worker stored for them."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from tests.support.fleet import wait_until
from tool_workers.contract.broker import create_app
from tool_workers.contract.marker import marker_key
from tool_workers.contract.names import task_id_for, task_name
from tool_workers.contract.settings import Settings


def direct(tool: str, **args: Any) -> PreparedCall:
    """A call of ``tool`` outside any graph, with a fresh call id."""
    call_id = f"{tool}-{time.monotonic_ns()}"
    return PreparedCall(tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id))


def watch_only(settings: Settings, tool: str) -> tuple[Any, PreparedCall]:
    """A call the dispatcher waits on but does not publish (the test publishes it)."""
    dispatcher = dispatcher_for(settings=settings)
    call = direct(tool)
    dispatcher._watch([call], None)
    # Claimed as published, so the waiter does not publish it itself.
    dispatcher._redis.set(marker_key(settings.key_prefix, call.task_id), "{}", ex=600)
    return dispatcher, call


def call_headers(task_id: str | None, tool: str = "add", **extra: Any) -> dict[str, Any]:
    """The headers of a task message for ``tool`` (no ``id`` when ``task_id`` is None)."""
    headers: dict[str, Any] = {"task": task_name(tool), "lang": "py", "argsrepr": "hand-made"}
    if task_id is not None:
        headers["id"] = task_id
    headers.update(extra)
    return headers


def publish_raw(
    settings: Settings,
    body: Any,
    headers: dict[str, Any],
    *,
    queue: str = "tools",
    **options: Any,
) -> None:
    """Publish ``body`` with ``headers`` straight onto ``queue`` through kombu.

    ``options`` go to kombu's ``Producer.publish``: ``serializer``, or ``content_type``
    with ``content_encoding`` for a body of bytes sent as is.
    """
    app = create_app(settings)
    target = app.amqp.queues[queue]  # its broker-side names (namespaced on RabbitMQ)
    with app.producer_or_acquire() as producer:
        producer.publish(
            body,
            routing_key=target.routing_key,
            exchange=target.exchange,
            declare=[target],
            headers=headers,
            **options,
        )


def stored_meta(settings: Settings, task_id: str) -> dict[str, Any] | None:
    """What the result backend holds for ``task_id`` (``None`` when nothing is stored)."""
    app = create_app(settings)
    client = redis.Redis.from_url(settings.backend_url)
    try:
        raw = client.get(app.backend.get_key_for_task(task_id))
    finally:
        client.close()
    return None if raw is None else dict(json.loads(raw))


def wait_stored(settings: Settings, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """The ready state stored for ``task_id``, waiting up to ``timeout`` seconds for it."""
    deadline = time.monotonic() + timeout
    while True:
        meta = stored_meta(settings, task_id)
        if meta is not None and meta.get("status") in ("SUCCESS", "FAILURE", "REVOKED"):
            return meta
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing ready stored for {task_id} within {timeout} s: {meta}")
        time.sleep(0.05)


def push_raw(settings: Settings, entry: bytes, queue: str = "tools") -> None:
    """Push ``entry`` onto ``queue``'s Redis list as is, below kombu (no envelope)."""
    client = redis.Redis.from_url(settings.broker_url)
    prefix = f"{settings.namespace}:" if settings.namespace else ""
    try:
        client.lpush(f"{prefix}{queue}", entry)
    finally:
        client.close()


def stored(settings: Settings, task_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The call's finished meta (SUCCESS or FAILURE) as Celery's backend decodes it,
    waited for up to ``timeout`` seconds."""
    app = create_app(settings)
    try:
        return wait_until(
            lambda: (
                (m := app.backend.get_task_meta(task_id)).get("status") in ("SUCCESS", "FAILURE")
                and m
            ),
            timeout,
            f"a result for {task_id}",
        )
    finally:
        # Celery's app.close() leaves the result backend's connections open.
        app.backend.client.connection_pool.disconnect()
        app.close()
