"""The Celery app both sides build from one Settings object.

The orchestrator builds it to publish calls and read results; the worker builds it
and then registers one task per tool (:mod:`tool_workers.runtime.worker`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from tool_workers.contract.amqp import AMQP_CLASS, amqp_config
from tool_workers.contract.connections import celery_tls_config, keepalive_options, ssl_options
from tool_workers.contract.names import task_name
from tool_workers.contract.settings import Settings, ToolPolicies, is_sentinel_url

BACKEND_CLASS = "tool_workers.celery_ext.backend:ToolfleetRedisBackend"
SENTINEL_BACKEND_CLASS = "tool_workers.celery_ext.backend:ToolfleetSentinelBackend"

REDELIVERY_MARGIN = 30.0
"""Seconds added to the longest time limit to get the broker's visibility timeout."""

RESTORE_INTERVAL = 5
"""Seconds between the broker's scans for unacknowledged calls of dead workers."""


def visibility_timeout(policies: ToolPolicies, margin: float = REDELIVERY_MARGIN) -> float:
    """Seconds a fetched, unacknowledged call stays invisible before it is redelivered.

    Longer than any worker may hold a call (its hard time limit plus, for a tool with
    retries, the longest retry countdown it waits in the worker), plus a margin: a call
    that outlived the visibility timeout would be run a second time while still running.
    """
    return policies.longest_hold() + margin


def celery_config(settings: Settings, policies: ToolPolicies) -> dict[str, Any]:
    """The Celery configuration toolfleet runs with."""
    timeout = settings.socket_timeout
    keepalive = keepalive_options(settings)
    if settings.broker_is_amqp:
        hold = visibility_timeout(policies, settings.redelivery_margin)
        broker = amqp_config(settings, hold)
    else:
        broker = {"broker_transport_options": _redis_transport(settings, policies)}
    backend_transport: dict[str, Any] = {
        # A store is retried every second while the link is down, for
        # TOOLFLEET_RESULT_STORE_RETRY: a call that finished during a cut reports its own
        # result once the link is back (as its answer, or as a late result after the call
        # was handed on), however long the cut was.
        "retry_policy": {"timeout": settings.result_store_retry, "max_retries": None},
        "socket_keepalive_options": keepalive,
    }
    if settings.namespace:
        backend_transport["global_keyprefix"] = f"{settings.namespace}:"
    backend_class = BACKEND_CLASS
    if is_sentinel_url(settings.backend_url):
        backend_class = SENTINEL_BACKEND_CLASS
        backend_transport.update(sentinel_options(settings))
    routes = {task_name(name): {"queue": policies.for_tool(name).queue} for name in policies.tools}
    return {
        "broker_url": settings.broker_url,
        # Celery's Redis backend with atomic stores and reply-channel publishing.
        "result_backend": f"{backend_class}+{settings.backend_url}",
        **broker,
        "result_backend_transport_options": backend_transport,
        "broker_connection_retry_on_startup": True,
        # A worker reconnects however long the cut: Celery's default gives up after 100
        # attempts (about 6 minutes at one a second) and its consumer stops for good.
        "broker_connection_max_retries": None,
        "redis_backend_health_check_interval": max(1, round(timeout / 2)),
        "redis_socket_keepalive": True,
        "redis_socket_timeout": timeout,
        "redis_socket_connect_timeout": timeout,
        # The store script never overwrites a stored success, and reads are reads: a
        # command replayed after a timeout does no harm.
        "redis_retry_on_timeout": True,
        # JSON only: a pickled message is refused, never executed.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": policies.defaults.queue,
        "task_default_exchange": policies.defaults.queue,
        "task_default_routing_key": policies.defaults.queue,
        "task_routes": routes,
        "task_create_missing_queues": True,
        # A call is acknowledged only after it ran; a worker that dies mid-call gives
        # it back to the broker.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # The task records STARTED itself, in the round trip that counts its start.
        "task_track_started": False,
        "task_time_limit": policies.defaults.time_limit,
        "worker_prefetch_multiplier": settings.prefetch_multiplier,
        "result_expires": settings.result_expires,
        "result_extended": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # After a reconnect Celery lowers the prefetch count and raises it back from each
        # ack's callback, which runs on the thread that ends the call: on the threads pool
        # a pool thread, whose synchronous basic.qos reads the socket the consumer reads
        # (frames interleave, the connection drops again, running calls are redelivered).
        # Off: the full prefetch count at once, as before Celery 5.4.
        "worker_enable_prefetch_count_reduction": False,
        "broker_channel_error_retry": True,
        # rediss:// URLs: the certificate checks of TOOLFLEET_REDIS_SSL_*.
        **celery_tls_config(settings),
        "worker_consumer": "tool_workers.celery_ext.consumer:ToolfleetConsumer",
        # toolfleet's own keys (the calls' markers) beside Celery's.
        "toolfleet_key_prefix": settings.key_prefix,
        # Workers take no say from headers the signature does not cover (consumer).
        "toolfleet_signed": bool(settings.signing_key),
    }


def _redis_transport(settings: Settings, policies: ToolPolicies) -> dict[str, Any]:
    """kombu's Redis transport options: visibility timeout, restore scans, socket timeouts."""
    timeout = settings.socket_timeout
    keepalive = keepalive_options(settings)
    transport: dict[str, Any] = {
        "visibility_timeout": visibility_timeout(policies, settings.redelivery_margin),
        # A dead worker's calls come back within visibility_timeout + this interval.
        "unacked_restore_interval": RESTORE_INTERVAL,
        "unacked_restore_throttle": 1,
        # A cut link must not freeze the worker's main process: without a socket timeout
        # a command on a dead connection (an ack, the unacked-restore scan) blocks it, and
        # with it the timers that fire time limits, until TCP gives up minutes later. The
        # BRPOP and pub/sub connections (read by the event loop, where no socket timeout
        # applies) are dropped by kombu's health check and TCP_USER_TIMEOUT.
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive,
        "health_check_interval": max(1, round(timeout / 2)),
        # Not replayed on a timeout: a publish whose reply was lost may be queued already,
        # and a second copy would run the call twice.
        "retry_on_timeout": False,
        # One list per queue, not kombu's four (one per priority step): toolfleet publishes
        # every call at the default priority, and a worker's BRPOP, sent again after each
        # delivery, named all four lists of each of its queues (one per tool).
        "priority_steps": [0],
    }
    if settings.namespace:
        transport["global_keyprefix"] = f"{settings.namespace}:"
    if is_sentinel_url(settings.broker_url):
        transport.update(sentinel_options(settings))
    return transport


def sentinel_options(settings: Settings) -> dict[str, Any]:
    """kombu's and Celery's Sentinel options: the primary's name, the Sentinels' own
    password and timeouts."""
    own: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
    }
    if settings.sentinel_tls:
        own.update(ssl=True, **ssl_options(settings))
    if settings.sentinel_password:
        own["password"] = settings.sentinel_password
    return {"master_name": settings.sentinel_master, "sentinel_kwargs": own}


def create_app(
    settings: Settings, policies: ToolPolicies | None = None, main: str = "toolfleet"
) -> Celery:
    """Build the Celery app for ``settings`` (no tasks registered).

    Args:
        settings: Process settings.
        policies: Per-tool policy; read from ``settings`` when omitted.
        main: Name of the app (shown by Celery and Flower).

    Returns:
        A configured Celery app.
    """
    policies = policies if policies is not None else settings.policies()
    # RabbitMQ has no key prefix: its queue table names the namespace's queues itself.
    amqp = AMQP_CLASS if settings.broker_is_amqp else None
    app = Celery(main, set_as_current=False, amqp=amqp)
    app.conf.update(celery_config(settings, policies))
    return app


def backend_url_of(app: Celery) -> str | None:
    """The Redis URL of ``app``'s result backend (without a backend class prefix)."""
    configured = app.conf.result_backend
    if not isinstance(configured, str) or not configured:
        return None
    scheme, sep, _ = configured.partition("://")
    if sep and "+" in scheme:
        return configured.split("+", 1)[1]
    return configured
