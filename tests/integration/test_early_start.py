"""A call a worker runs at once is started in the round trip that records its delivery;
one that waits for a slot is started only when the pool takes it. Real workers, real
Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.local import EmbeddedRedis
from tests.faults.scaling import calls
from tests.support.fleet import (
    effects,
    fleet_settings,
    result_state,
    wait_started,
    wait_until,
)
from tool_workers.celery_ext.fence import HELD
from tool_workers.contract.marker import CallMarker, marker_key
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def _held(client: redis.Redis, settings: Settings) -> set[str]:
    """The calls the namespace's workers hold under their leases."""
    held: set[str] = set()
    for key in client.scan_iter(match=f"{settings.key_prefix}{HELD}*", count=1000):
        for entry in client.hvals(key):
            held.add(str(json.loads(entry)[0]))
    return held


def _starts(client: redis.Redis, settings: Settings, task_id: str) -> int:
    marker = CallMarker.parse(client.get(marker_key(settings.key_prefix, task_id)))
    return 0 if marker is None else marker.starts


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_call_waiting_for_a_slot_is_started_only_when_it_runs(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    redis_url: str,
    counter: redis.Redis,
    pool: str,
) -> None:
    """Given a worker with one slot that fetches ahead, when a second call arrives while
    the first runs, then the second is held by the worker but not started (its marker
    counts no start) until the first is done; each runs once. The first, which found the
    slot free, was started by the worker's main process with its record; the second by
    the process that ran it (a prefork pool's process, which the result names too)."""
    settings = make_settings(prefetch_multiplier=4)
    worker = start_worker(settings, pool=pool, concurrency=1)
    dispatcher = dispatcher_for(settings=settings)
    client = redis.Redis.from_url(redis_url)
    try:
        specs = dispatcher.served_tools(fresh=True)
        # The first runs long enough for the checks below to fall inside it.
        (first,) = calls(specs, "touch", 1, seconds=8.0)
        (waiting,) = calls(specs, "touch", 1)
        dispatcher.submit([first])
        assert wait_started(settings, first.task_id)["pid"] == worker.pid
        dispatcher.submit([waiting])
        wait_until(
            lambda: waiting.task_id in _held(client, settings), 10, "the second call's fetch"
        )
        assert _starts(client, settings, waiting.task_id) == 0
        assert _starts(client, settings, first.task_id) == 1
        assert result_state(settings, first.task_id) is None, "the first call ended already"
        results = [dispatcher.wait(c, timeout=60) for c in (first, waiting)]
        assert [r.status for r in results] == ["success", "success"], results
        assert _starts(client, settings, waiting.task_id) == 1
        ran_in = results[1].pid
        assert wait_started(settings, waiting.task_id)["pid"] == ran_in
        assert (ran_in == worker.pid) == (pool == "threads"), (ran_in, worker.pid)
        assert effects(counter, settings, "touch") == {first.task_id: 1, waiting.task_id: 1}
    finally:
        client.close()
        dispatcher.close()


def test_a_call_starts_after_the_server_forgot_the_start_script(
    start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    """Given a threads worker on a server that forgets its scripts (a flush, a restart),
    when calls come after the flush, then each is recorded, started once and answered:
    the first one's start goes with its task body, the next ones with their records."""
    with EmbeddedRedis() as server:
        settings = fleet_settings(server.url, tmp_path)
        start_worker(settings, pool="threads", concurrency=2)
        dispatcher = dispatcher_for(settings=settings)
        client = redis.Redis.from_url(server.url)
        try:
            specs = dispatcher.served_tools(fresh=True)
            warm, *after = calls(specs, "touch", 3)
            dispatcher.submit([warm])
            assert dispatcher.wait(warm, timeout=30).status == "success"
            client.script_flush()
            for call in after:
                dispatcher.submit([call])
                assert dispatcher.wait(call, timeout=30).status == "success"
                assert _starts(client, settings, call.task_id) == 1
            assert effects(client, settings, "touch") == {c.task_id: 1 for c in (warm, *after)}
        finally:
            client.close()
            dispatcher.close()
