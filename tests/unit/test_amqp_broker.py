"""RabbitMQ as the broker: where toolfleet's Redis is, and the Celery settings it gets."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from tool_workers.contract.broker import create_app, visibility_timeout
from tool_workers.contract.settings import Settings, ToolPolicies, ToolPolicy, settings_error

AMQP = "amqp://guest:guest@rabbit:5672//"
REDIS = "redis://cache:6379/0"


def test_redis_url_is_toolfleet_redis_with_an_amqp_broker() -> None:
    """Given an amqp:// broker and TOOLFLEET_REDIS_URL, then results and toolfleet's own
    records go to that Redis, never to the broker URL."""
    settings = Settings(broker_url=AMQP, redis_url=REDIS)

    assert settings.own_redis_url == REDIS
    assert settings.backend_url == REDIS
    assert create_app(settings, ToolPolicies()).conf.result_backend.endswith(f"+{REDIS}")


def test_redis_url_defaults_to_the_result_backend() -> None:
    settings = Settings(broker_url="amqps://u:p@rabbit:5671//", result_backend=REDIS)

    assert settings.own_redis_url == REDIS
    assert Settings(broker_url=REDIS).own_redis_url == REDIS


def test_amqp_broker_without_a_redis_url_is_one_clear_line() -> None:
    """Given an amqp:// broker and neither a result backend nor a Redis URL, then the
    settings are refused in one line naming the variables to set."""
    with pytest.raises(ValidationError) as caught:
        Settings(broker_url=AMQP)

    line = settings_error(caught.value)
    assert "\n" not in line
    assert "TOOLFLEET_REDIS_URL" in line and "TOOLFLEET_RESULT_BACKEND" in line


def test_two_different_redis_servers_are_refused() -> None:
    with pytest.raises(ValidationError, match="different servers"):
        Settings(broker_url=AMQP, redis_url=REDIS, result_backend="redis://other:6379/0")


def test_amqp_broker_gets_confirms_heartbeats_and_a_consumer_timeout() -> None:
    """Given a tool with a long time limit, then every task queue's consumer timeout is
    above the longest hold, publishes wait for confirms, and heartbeats are short."""
    policies = ToolPolicies(tools={"long": {"time_limit": 2000, "queue": "slow"}})
    settings = Settings(broker_url=AMQP, redis_url=REDIS, socket_timeout=5)
    app = create_app(settings, policies)

    assert app.conf.broker_transport_options["confirm_publish"] is True
    assert "visibility_timeout" not in app.conf.broker_transport_options
    assert app.conf.broker_heartbeat == 10
    for name in ("tools", "slow"):
        timeout_ms = app.amqp.queues[name].queue_arguments["x-consumer-timeout"]
        assert timeout_ms > visibility_timeout(policies) * 1000 > 2000 * 1000
    assert app.conf.task_acks_late is True


def test_namespace_names_every_broker_queue_and_exchange() -> None:
    """RabbitMQ has no key prefix: a namespace's queues, exchanges and routing keys, and
    Celery's control exchange, carry the namespace on the broker; -Q names stay plain."""
    settings = Settings(broker_url=AMQP, redis_url=REDIS, namespace="ns1")
    app = create_app(settings, ToolPolicies(defaults=ToolPolicy(queue="tools")))

    queue = app.amqp.router.route({}, "tools.anything")["queue"]
    assert (queue.name, queue.exchange.name, queue.routing_key) == ("ns1:tools",) * 3
    assert app.amqp.queues["prefork"].name == "ns1:prefork"
    assert app.conf.control_exchange == "ns1:celery"


def test_quorum_queues_are_a_setting() -> None:
    classic = create_app(Settings(broker_url=AMQP, redis_url=REDIS), ToolPolicies())
    quorum = create_app(
        Settings(broker_url=AMQP, redis_url=REDIS, amqp_queue_type="quorum"), ToolPolicies()
    )

    assert "x-queue-type" not in classic.amqp.queues["tools"].queue_arguments
    assert quorum.amqp.queues["tools"].queue_arguments["x-queue-type"] == "quorum"
    assert quorum.amqp.queues["other"].queue_arguments["x-queue-type"] == "quorum"


def test_redis_broker_config_is_unchanged() -> None:
    app = create_app(Settings(broker_url=REDIS, namespace="ns1"), ToolPolicies())

    assert app.conf.broker_transport_options["global_keyprefix"] == "ns1:"
    assert app.amqp.queues["tools"].name == "tools"


def test_no_acknowledging_thread_sets_the_prefetch_count_after_a_reconnect() -> None:
    """Given a worker that reconnected with calls running, when a call received since
    ends, then acknowledging it sets no prefetch count.

    Celery restores a prefetch count it lowered at the reconnect from the ack's own
    callback: on the threads pool that is a pool thread, whose synchronous ``basic.qos``
    reads the socket while the consumer thread reads it too. The frames interleave
    (``UnexpectedFrame``), the connection drops again, and RabbitMQ hands the running
    calls to other workers a second time: an idempotent call ran three times.
    """
    from celery.worker.consumer import Consumer

    class QoS:
        def __init__(self) -> None:
            self._mutex = threading.RLock()
            self.value = 6
            self.sets: list[int] = []

        def set(self, value: int) -> None:
            self.sets.append(value)

    app = create_app(Settings(broker_url=AMQP, redis_url=REDIS))
    consumer = SimpleNamespace(
        app=app,
        qos=QoS(),
        _maximum_prefetch_restored=False,
        _new_prefetch_count=7,
        max_prefetch_count=8,
        initial_prefetch_count=6,
    )
    Consumer._restore_prefetch_count_after_connection_restart(consumer, None)
    assert consumer.qos.sets == []
