"""Celery's teardown of a lost broker connection leaves the worker's consumer alive.

When a worker's link to Redis is lost, Celery's consumer tears the connection down
(``on_connection_error_after_connected``: kombu's ``Connection.collect``, then
``Connection.close``) and reconnects. Over a cut link the reply of a channel's
outstanding BRPOP never comes; Celery bounds that read, and kombu 5.7 then left the
consumer's channel to be closed after the transport was detached from its connection:
restoring its unacknowledged delivery raised ``AttributeError`` (``conninfo.hostname``)
and the consumer died. Here the cut is played by a BRPOP whose reply is due in 30 s and
a read bound of 0.3 s, against the real Redis; the teardown is Celery's own code.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker.consumer import consumer as celery_consumer
from kombu import Connection, Consumer, Exchange, Queue
from kombu.transport import redis as kombu_redis

from tool_workers.celery_ext.transport import Transport

TEARDOWN_BOUND = 0.3
"""Seconds Celery gives each read of the teardown (5 s in a worker)."""


@pytest.fixture
def cut_link(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setattr(celery_consumer, "COLLECT_SOCKET_TIMEOUT", TEARDOWN_BOUND)
    yield {
        "url": redis_url,
        # The BRPOP's reply is due long after the teardown's bound: the link looks cut.
        "options": {"brpop_timeout": 30, "global_keyprefix": f"tft-{uuid.uuid4().hex[:8]}:"},
    }


def consumer_with_a_delivery(cut_link: dict[str, Any], transport: type) -> tuple[Connection, Queue]:
    """A connection as a worker's consumer holds it: one delivery unacknowledged on the
    default channel, a second channel consuming (the control mailbox), and a BRPOP of
    each outstanding."""
    connection = Connection(
        cut_link["url"], transport=transport, transport_options=cut_link["options"]
    )
    calls = Queue("calls", Exchange("calls", type="direct"), routing_key="calls")
    idle = Queue("idle", Exchange("idle", type="direct"), routing_key="idle")
    held: list[Any] = []
    Consumer(connection, [calls], callbacks=[lambda _, message: held.append(message)]).consume()
    with connection.Producer() as producer:
        producer.publish({"call": 1}, exchange=calls.exchange, routing_key="calls", declare=[calls])
    connection.drain_events(timeout=5)
    assert len(held) == 1
    Consumer(connection.channel(), [idle], callbacks=[lambda *_: None]).consume()
    with pytest.raises(TimeoutError):
        connection.drain_events(timeout=0.05)  # sends each channel's BRPOP; no reply yet
    return connection, calls


def tear_down_as_celery_does(connection: Connection) -> None:
    """Celery's consumer after a connection error, on ``connection``."""
    consumer = SimpleNamespace(
        connection=connection,
        app=SimpleNamespace(
            conf=SimpleNamespace(
                worker_cancel_long_running_tasks_on_connection_loss=True,
                worker_enable_prefetch_count_reduction=False,
            )
        ),
    )
    celery_consumer.Consumer.on_connection_error_after_connected(
        consumer, ConnectionError("the link was cut")
    )


# The half-closed connection it leaves behind is collected here, not in a later test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_stock_kombu_kills_the_consumer_in_this_teardown(cut_link: dict[str, Any]) -> None:
    """Pins the kombu bug toolfleet's transport works around (tool_workers.compat.kombu):
    when this fails, kombu closes every channel of a lost connection itself, and the
    workaround can go."""
    connection, _ = consumer_with_a_delivery(cut_link, kombu_redis.Transport)
    with pytest.raises(AttributeError, match="hostname"):
        tear_down_as_celery_does(connection)
    del connection
    gc.collect()


# kombu gives deliveries back on a client it opens after closing the channel's pools;
# that client is collected here, not in a later test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_teardown_closes_every_channel_and_gives_the_delivery_back(
    cut_link: dict[str, Any],
) -> None:
    """Given a consumer holding a delivery, with a BRPOP outstanding on each of its
    channels, when Celery tears its connection down after a cut, then nothing raises (the
    consumer reconnects rather than dies) and the delivery is back on its queue."""
    connection, calls = consumer_with_a_delivery(cut_link, Transport)

    tear_down_as_celery_does(connection)

    again = Connection(cut_link["url"], transport=Transport, transport_options=cut_link["options"])
    try:
        message = calls.bind(again.default_channel).get(no_ack=True)
        assert message is not None
        assert message.payload == {"call": 1}
    finally:
        again.release()
    del connection
    gc.collect()
