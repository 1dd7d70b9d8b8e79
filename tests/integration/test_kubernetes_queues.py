"""The lists (or RabbitMQ queues) the ScaledObjects of deploy/kubernetes/ watch are the
ones calls really wait in: for each overlay, real workers run with the Deployments' -Q
and the pods' settings (namespace, policy file), stop consuming for a moment, and the
calls an orchestrator sends to each kind's tools are found in the list named in that
kind's ScaledObject on a real broker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.cli.status import broker_key
from orchestrator.local import EmbeddedRedis, WorkerProcess
from tests.support import kustomize
from tests.support.amqp import amqp_test_url, delete_namespace
from tests.support.fleet import REPO, wait_until
from tests.support.kubernetes import (
    WORKER_KINDS,
    deployment_settings,
    trigger_key,
    worker_queues,
)
from tool_workers.contract.broker import create_app
from tool_workers.contract.names import task_id_for

pytestmark = pytest.mark.timeout(180)

CALLS = {
    "tool-worker": ("list_dir", {"path": "."}),
    "sandbox-worker": ("run_python", {"code": "1"}),
}
"""One built-in tool of each kind, and arguments for it (the calls never run)."""
OVERLAY_CASES = ["trial", "production"] + (["rabbitmq"] if amqp_test_url() else [])


@pytest.fixture
def private_redis() -> Iterator[str]:
    """A Redis of this test's own: the overlays' namespaces (none, "prod") are used as
    they are, and vanish with the server."""
    with EmbeddedRedis() as server:
        yield server.url


@pytest.mark.parametrize("overlay", OVERLAY_CASES)
def test_calls_wait_in_the_lists_the_scaled_objects_watch(
    overlay: str, private_redis: str, tmp_path: Path
) -> None:
    resources = kustomize.render(REPO / "deploy" / "kubernetes" / "overlays" / overlay)
    overrides: dict[str, str] = {"broker_url": private_redis}
    amqp = trigger_key(resources, "tool-worker")[0] == "rabbitmq"
    if amqp:
        overrides = {"broker_url": str(amqp_test_url()), "redis_url": private_redis}
    settings = deployment_settings(resources, tmp_path, registry_refresh=1.0, **overrides)
    workers = {
        kind: WorkerProcess(
            settings,
            name=kind,
            concurrency=1,
            queues=worker_queues(resources, kind),
            log_file=tmp_path / f"{kind}.log",
        )
        for kind in WORKER_KINDS
    }
    app = create_app(settings)
    dispatcher = None
    try:
        for worker in workers.values():
            worker.start()
        for worker in workers.values():
            worker.wait_ready()
        # Each worker stops consuming its kind's queue: calls sent there wait. A worker
        # hears broadcasts once its control channel is subscribed, which may come after
        # its registry entry (what wait_ready sees): asked until it answers.
        for kind, worker in workers.items():
            for queue in worker_queues(resources, kind):
                # RabbitMQ's consumers are known by the queue's broker name.
                name = broker_key(settings, app, queue) if amqp else queue
                wait_until(
                    lambda name=name, worker=worker: app.control.cancel_consumer(
                        name, destination=[worker.hostname], reply=True, timeout=1.0
                    ),
                    20,
                    f"{worker.hostname}'s answer to cancelling its consumer of {name}",
                )
        dispatcher = dispatcher_for(settings=settings)
        served = dispatcher.served_tools(fresh=True)
        sent: dict[str, set[str]] = {}
        for kind, (tool, args) in CALLS.items():
            spec = served[tool]
            calls = []
            for _ in range(3):
                call_id = f"k8s-{uuid.uuid4().hex[:8]}"
                calls.append(PreparedCall(
                    tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id),
                    queue=spec.queue, spec=spec,
                ))  # fmt: skip
            dispatcher.submit(calls)
            sent[kind] = {c.task_id for c in calls}
        for kind in WORKER_KINDS:
            _, watched = trigger_key(resources, kind)
            if amqp:
                found = wait_until(
                    lambda watched=watched: _amqp_depth(str(amqp_test_url()), watched) >= 3,
                    20,
                    f"3 calls in RabbitMQ queue {watched}",
                )
                assert found
            else:
                ids = wait_until(
                    lambda watched=watched, kind=kind: (
                        ids if sent[kind] <= (ids := _list_ids(private_redis, watched)) else None
                    ),
                    20,
                    f"the {kind} calls in list {watched!r}",
                )
                assert sent[kind] <= ids
            print(f"{overlay}: {kind} calls wait in {watched!r}")
    finally:
        if dispatcher is not None:
            dispatcher.close()
        app.close()
        for worker in workers.values():
            worker.stop()
        if amqp:
            delete_namespace(str(amqp_test_url()), settings.namespace, ("tools", "sandbox"))


def _list_ids(url: str, key: str) -> set[str]:
    client = redis.Redis.from_url(url)
    try:
        return {json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1)}
    finally:
        client.close()


def _amqp_depth(url: str, queue: str) -> int:
    with Connection(url, connect_timeout=5) as conn:
        return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
