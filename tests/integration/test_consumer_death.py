"""A worker whose consumer stops on an error Celery cannot recover from does not live on
as a zombie: its lease lapses at once (its calls are handed on) and the worker ends
with a cold shutdown and exit status 1, for its supervisor to restart it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import redis
from celery.exceptions import WorkerTerminate
from celery.worker.consumer import Consumer

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.consumer import ToolfleetConsumer
from tool_workers.celery_ext.lease import Lease, leases_key
from tool_workers.contract.settings import Settings


@pytest.fixture
def lease(make_settings: Callable[..., Settings]) -> Iterator[Lease]:
    settings = make_settings()
    client = redis.Redis.from_url(settings.broker_url)
    held = Lease(client, settings.key_prefix, "", ttl=10, refresh=0.2, retention=60)
    held.tick()  # registered, live for 10 s
    leases.install(held.start())
    try:
        yield held
    finally:
        leases.install(None)
        held.stop()
        client.close()


def test_a_consumer_that_dies_ends_the_worker_and_lapses_its_lease(
    lease: Lease, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a worker holding a live lease, when its consumer stops on an error Celery
    does not recover from, then the worker is terminated (cold shutdown) with exit status
    1, and its lease has lapsed already: the next sweep hands its calls on."""

    def dies(self: Consumer) -> None:
        raise AttributeError("'NoneType' object has no attribute 'hostname'")

    monkeypatch.setattr(Consumer, "start", dies)
    controller = SimpleNamespace(exitcode=None)
    consumer = object.__new__(ToolfleetConsumer)
    consumer.controller = controller
    key = leases_key(lease.key_prefix)
    assert lease.client.zscore(key, lease.id) is not None

    with pytest.raises(WorkerTerminate):
        consumer.start()

    assert controller.exitcode == 1
    assert lease.client.zscore(key, lease.id) == 0  # lapsed: swept by the next sweep
    survivor = Lease(lease.client, lease.key_prefix, "", ttl=10, refresh=0.2, retention=60)
    survivor.tick()  # another worker's sweep
    assert lease.client.zscore(key, lease.id) is None


def test_a_worker_shutdown_passes_through(lease: Lease, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a live lease, when the consumer ends because the worker shuts down, then
    the lease is left alone (a warm shutdown lets its calls finish)."""

    def shuts_down(self: Consumer) -> None:
        raise WorkerTerminate(0)

    monkeypatch.setattr(Consumer, "start", shuts_down)
    consumer = object.__new__(ToolfleetConsumer)
    consumer.controller = SimpleNamespace(exitcode=None)
    with pytest.raises(WorkerTerminate):
        consumer.start()
    assert (lease.client.zscore(leases_key(lease.key_prefix), lease.id) or 0) > 0
