"""RabbitMQ as the broker: what differs from Redis, in one place.

With an ``amqp://`` (or ``amqps://``) broker URL the calls travel through RabbitMQ while
results, the registry and toolfleet's markers stay in Redis (``TOOLFLEET_REDIS_URL`` or
the result backend). The differences:

* **Redelivery.** RabbitMQ gives a call back as soon as the connection of the worker
  holding it closes: at once when the worker process dies (its kernel closes the
  socket), but when its host vanishes (no FIN, no RST) only once the heartbeat (twice
  ``socket_timeout``: 10 s) gives up on the connection, 20 to 30 s later. There is no
  visibility timeout. The worker leases decide first, as on Redis: a lapsed lease's
  calls are handed on as copies within ``lease_ttl`` + ``lease_refresh`` (11 s), and the
  original is dropped unrun when RabbitMQ gives it back
  (:mod:`tool_workers.celery_ext.amqp_lease`). The heartbeat is the fallback when no
  worker survives to sweep.
* **Consumer timeout.** RabbitMQ closes the channel of a consumer that holds an
  unacknowledged message longer than its ``consumer_timeout`` (30 minutes by default),
  and redelivers the message. Calls are acknowledged late, after they ran, so every task
  queue is declared with ``x-consumer-timeout`` above the longest a worker may hold a
  call (servers from 3.12 honour it per queue; older ones ignore the argument and apply
  the server-wide value, 30 minutes unless configured: a tool with a longer time limit
  needs RabbitMQ 3.12 or a larger ``consumer_timeout`` in ``rabbitmq.conf``).
* **A broker restart or blip** closes the connections, and RabbitMQ gives back every
  unacknowledged call, running ones included (an acknowledgement belongs to the channel
  it was delivered on). A worker handed its own running call again drops the copy
  (:mod:`tool_workers.celery_ext.consumer`); a copy handed to another worker is a redelivery there.
* **Publisher confirms.** A publish returns once RabbitMQ has taken the message
  (kombu's ``confirm_publish``): a call the orchestrator counts as sent is queued.
* **Queue type.** Classic queues by default; ``TOOLFLEET_AMQP_QUEUE_TYPE=quorum`` for
  replicated queues (Celery then uses per-consumer QoS, which quorum queues need).
* **Namespaces.** RabbitMQ has no key prefix: with ``TOOLFLEET_NAMESPACE`` set, every
  task queue, its exchange and routing key, and Celery's control and event exchanges are
  named ``<namespace>:...`` on the broker. Celery, the registry and ``-Q`` keep using the
  plain queue names.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP, Queues
from kombu.entity import Exchange, Queue

from tool_workers.compat import celery as celery_compat
from tool_workers.contract.connections import keepalive_options
from tool_workers.contract.settings import Settings

AMQP_CLASS = f"{__name__}:ToolfleetAMQP"


def queue_prefix(settings: Settings) -> str:
    """What every broker-side name of this namespace starts with (empty: no namespace)."""
    return f"{settings.namespace}:" if settings.namespace else ""


def consumer_timeout(hold: float) -> int:
    """The ``x-consumer-timeout`` (milliseconds) for calls held at most ``hold`` seconds.

    Twice the hold: a call prefetched behind a running one waits its turn while already
    delivered, and RabbitMQ counts that wait too.
    """
    return int(2 * hold * 1000)


def amqp_config(settings: Settings, hold: float) -> dict[str, Any]:
    """The Celery settings of a RabbitMQ broker (merged into the common ones).

    Args:
        settings: Process settings (timeouts, namespace, queue type).
        hold: The longest seconds a worker may hold one call (its time limit and retries,
            plus the redelivery margin).
    """
    timeout = settings.socket_timeout
    prefix = queue_prefix(settings)
    config: dict[str, Any] = {
        # Used by RabbitMQ to close the connection of a host that stopped answering, and
        # so to give back its calls (the originals: the lease's copies run first).
        "broker_heartbeat": max(2, round(2 * timeout)),
        "broker_connection_timeout": timeout,
        "broker_transport_options": {
            # Each publish waits for RabbitMQ's ack: a call counted as sent is queued.
            "confirm_publish": True,
            # A write to a cut link fails instead of blocking the worker's main process;
            # TCP_USER_TIMEOUT and keepalive drop a dead connection in seconds.
            "write_timeout": timeout,
            "socket_settings": keepalive_options(settings),
        },
        "toolfleet_queue_prefix": prefix,
        "toolfleet_queue_arguments": {"x-consumer-timeout": consumer_timeout(hold)},
        "worker_detect_quorum_queues": True,
    }
    if settings.amqp_queue_type == "quorum":
        config["task_default_queue_type"] = "quorum"
        config["task_create_missing_queue_type"] = "quorum"
    if prefix:
        config["control_exchange"] = f"{prefix}celery"
        config["event_exchange"] = f"{prefix}celeryev"
    return config


class NamespacedQueues(celery_compat.Queues):
    """Celery's queue table; each queue as the broker sees it (namespaced names, the
    consumer-timeout argument), kept under its plain name."""

    prefix = ""
    arguments: dict[str, Any] = {}

    def insert(self, queue: Any) -> Any:
        exchange = queue.exchange
        if exchange is None or not exchange.name:
            exchange = self.default_exchange or Exchange(queue.name)  # type: ignore[no-untyped-call]
        plain = queue.name
        if self.prefix and not plain.startswith(self.prefix):
            broker_exchange = Exchange(  # type: ignore[no-untyped-call]  # kombu is unannotated
                f"{self.prefix}{exchange.name}", exchange.type, durable=exchange.durable
            )
            queue = Queue(  # type: ignore[no-untyped-call]
                f"{self.prefix}{plain}",
                broker_exchange,
                f"{self.prefix}{queue.routing_key or plain}",
                queue_arguments={**(queue.queue_arguments or {})},
                durable=queue.durable,
                auto_delete=queue.auto_delete,
            )
        queue.queue_arguments = {**self.arguments, **(queue.queue_arguments or {})}
        self[plain] = queue
        return queue


class ToolfleetAMQP(AMQP):  # type: ignore[misc]  # celery is unannotated
    """Celery's ``app.amqp`` with :class:`NamespacedQueues`."""

    def Queues(self, queues: Any, *args: Any, **kwargs: Any) -> Queues:
        table_cls = type(
            "Queues",
            (NamespacedQueues,),
            {
                "prefix": self.app.conf.get("toolfleet_queue_prefix", ""),
                "arguments": dict(self.app.conf.get("toolfleet_queue_arguments") or {}),
            },
        )
        self.queues_cls = table_cls
        return super().Queues(queues, *args, **kwargs)


def broker_queue_name(app: Any, queue: str) -> str:
    """The name ``queue`` has on the broker (namespaced on RabbitMQ)."""
    return str(app.amqp.queues[queue].name)


def plain_queue_name(app: Any, name: str) -> str:
    """The name Celery, the registry and ``-Q`` know a broker queue ``name`` by."""
    prefix = str(app.conf.get("toolfleet_queue_prefix") or "")
    return name[len(prefix) :] if prefix and name.startswith(prefix) else name
