"""RabbitMQ for tests: whether it answers, and removing a namespace's queues afterwards.

RabbitMQ has no key prefix to scan for: a test's queues and exchanges are named
``<namespace>:<queue>`` (:mod:`tool_workers.contract.amqp`), and are deleted by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from kombu import Connection

AMQP_NAMESPACES: list[str] = []
"""Namespaces the RabbitMQ cases used: their queues are deleted when the session ends,
after every worker has stopped (a queue deleted under a live consumer is declared again)."""

CONTROL_NAMES = ("{p}celery.pidbox", "reply.{p}celery.pidbox", "{p}celeryev")
"""Celery's control and event exchanges of a namespace (prefix ``{p}``)."""


def brokers() -> list[str]:
    """The brokers a broker-parametrized test runs on: Redis, and RabbitMQ when
    ``TOOLFLEET_TEST_AMQP_URL`` names one."""
    return ["redis"] + (["rabbitmq"] if os.environ.get("TOOLFLEET_TEST_AMQP_URL") else [])


def amqp_problem(url: str) -> str | None:
    """Why the RabbitMQ at ``url`` cannot be used, or ``None`` when it answers."""
    try:
        with Connection(url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        return repr(exc)
    return None


def delete_namespace(url: str, namespace: str, queues: Iterable[str]) -> None:
    """Delete the broker queues and exchanges of ``namespace`` (those that exist)."""
    prefix = f"{namespace}:"
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in queues:
            name = f"{prefix}{queue}"
            for delete in (channel.queue_delete, channel.exchange_delete):
                try:
                    delete(name)
                except conn.channel_errors:
                    channel = conn.channel()  # a channel error closes the channel
        for pattern in CONTROL_NAMES:
            try:
                channel.exchange_delete(pattern.format(p=prefix))
            except conn.channel_errors:
                channel = conn.channel()
