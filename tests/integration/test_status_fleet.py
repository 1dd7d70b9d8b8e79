"""`toolfleet status` against a real fleet: twins of one node name, exited orchestrators."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from orchestrator.cli.status import collect
from tool_workers.contract.broker import create_app
from tool_workers.contract.names import placement_key, worker_processes_key
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def _noted(settings: Settings, pid: int) -> bool:
    client = redis.Redis.from_url(settings.own_redis_url)
    try:
        key = worker_processes_key(settings.key_prefix, f"twin@{socket.gethostname()}")
        return client.zscore(key, f"{socket.gethostname()}:{pid}") is not None
    finally:
        client.close()


def test_status_warns_about_twin_workers_and_hides_exited_orchestrators(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given two worker processes started with one node name and the placement record of
    an orchestrator process that exited, when the status is collected, then the name is
    reported as duplicated and the exited process's placement is not shown."""
    settings = make_settings()
    start_worker(settings, name="twin", queues=("tools",))
    twin = start_worker(settings, name="twin", queues=("tools",), wait=False)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    client = redis.Redis.from_url(settings.own_redis_url)
    host = socket.gethostname()
    record = {"host": host, "pid": exited.pid, "at": 0.0, "tools": {}}
    client.set(placement_key(settings.key_prefix, host, exited.pid), json.dumps(record), ex=60)
    client.close()

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _noted(settings, twin.pid):
        time.sleep(0.2)

    status = collect(settings, timeout=5.0)

    assert [w.name for w in status.workers] == [f"twin@{host}"]
    assert status.duplicates == [f"twin@{host}"]
    assert status.placement == []


def test_status_counts_the_calls_waiting_in_the_broker(
    make_settings: Callable[..., Settings], broker_settings: dict[str, Any]
) -> None:
    """Given three calls published to a queue no worker consumes, when the status is
    collected, then that queue's depth is 3, read from the broker (Redis list lengths, or
    RabbitMQ's message count)."""
    settings = make_settings(**broker_settings)
    app = create_app(settings)
    try:
        for i in range(3):
            app.send_task("tools.hang", args=[[], {}], task_id=f"wait-{i}", queue="prefork")
        status = collect(settings, app=app, timeout=0.5)
    finally:
        app.close()

    depths = {queue.name: queue.depth for queue in status.queues}
    assert depths["prefork"] == 3
    assert depths["tools"] == 0
