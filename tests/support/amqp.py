"""RabbitMQ for tests: whether it answers, and removing a namespace's queues afterwards.

RabbitMQ has no key prefix to scan for: a test's queues and exchanges are named
``<namespace>:<queue>`` (:mod:`tool_workers.contract.amqp`), and are deleted by name.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterable

from kombu import Connection

AMQP_NAMESPACES: list[str] = []
"""Namespaces the RabbitMQ cases used: their queues are deleted when the session ends,
after every worker has stopped (a queue deleted under a live consumer is declared again)."""

CONTROL_NAMES = ("{p}celery.pidbox", "reply.{p}celery.pidbox", "{p}celeryev")
"""Celery's control and event exchanges of a namespace (prefix ``{p}``)."""


LOCAL_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
"""Where a RabbitMQ server on this machine answers with its default login."""


@functools.cache
def amqp_test_url() -> str | None:
    """The RabbitMQ server the RabbitMQ cases use: ``TOOLFLEET_TEST_AMQP_URL`` when set
    (it must answer), else one answering on this machine's default port, else none."""
    named = os.environ.get("TOOLFLEET_TEST_AMQP_URL")
    if named:
        return named
    with socket.socket() as probe:
        probe.settimeout(0.5)
        if probe.connect_ex(("127.0.0.1", 5672)) != 0:
            return None
    return LOCAL_AMQP_URL if amqp_problem(LOCAL_AMQP_URL) is None else None


def brokers() -> list[str]:
    """The brokers a broker-parametrized test runs on: Redis, and RabbitMQ wherever one
    answers (:func:`amqp_test_url`)."""
    return ["redis"] + (["rabbitmq"] if amqp_test_url() else [])


@functools.cache
def tool_queues() -> tuple[str, ...]:
    """The tool queues (``tool:<name>:<version>``) of every tool the test fleets serve:
    workers declare them on RabbitMQ, so they are deleted by name with the rest."""
    return tool_queues_of("tests.fleet_tools", "tests.fleet_tools_v2", "tool_workers.builtin")


@functools.cache
def tool_queues_of(*modules: str) -> tuple[str, ...]:
    """The tool queues of the tools of ``modules``."""
    from tool_workers.contract.names import tool_queue
    from tool_workers.contract.settings import Settings, ToolPolicy
    from tool_workers.runtime.loader import tools_of_module
    from tool_workers.runtime.tasks import tool_spec

    settings = Settings()
    names = set()
    for module in modules:
        for tool in tools_of_module(module, settings):
            spec = tool_spec(tool, ToolPolicy())
            queue = tool_queue(spec.name, spec.version)
            if queue is not None:
                names.add(queue)
    return tuple(sorted(names))


def amqp_problem(url: str) -> str | None:
    """Why the RabbitMQ at ``url`` cannot be used, or ``None`` when it answers."""
    try:
        with Connection(url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        return repr(exc)
    return None


def delete_namespace(url: str, namespace: str, queues: Iterable[str]) -> None:
    """Delete the broker queues and exchanges of ``namespace`` (those that exist), the
    test fleets' tool queues included."""
    prefix = f"{namespace}:"
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in (*queues, *tool_queues()):
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
