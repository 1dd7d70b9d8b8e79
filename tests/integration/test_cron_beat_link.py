"""A replica's cron beat outlives a lost link to Redis."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from orchestrator.bench.links import proxied
from orchestrator.server.cronbeat import BEAT_INTERVAL, LOCK_SECONDS, CronBeat
from orchestrator.server.keys import Keys
from tests.support.cut_proxy import CutProxy
from tests.support.fleet import new_namespace, wait_until
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def holding(beat: CronBeat) -> Any:
    """The scheduler of the beat running now, if it holds RedBeat's lock."""
    thread = beat._service
    service = thread.service if thread is not None else None
    scheduler = vars(service).get("scheduler") if service is not None else None
    return scheduler if scheduler is not None and scheduler.lock is not None else None


def acquired(beat: CronBeat, within: float, other_than: Any = None) -> Any:
    """Wait until beat's thread is alive with a scheduler (not ``other_than``) that
    acquired the lock; returns that scheduler."""

    def live() -> Any:
        scheduler = holding(beat)
        alive = beat._service is not None and beat._service.is_alive()
        return scheduler if alive and scheduler is not other_than else None

    return wait_until(live, within, "a live beat that acquired the lock")


def test_given_beat_cut_off_from_redis_then_it_starts_again_and_takes_the_lock(
    redis_url: str,
) -> None:
    """Given a replica's beat holding the lock on a link through a proxy, when the link
    is cut for longer than beat's sleep (its next tick meets the cut), then beat's thread
    lives on and, once its former lock lapses, owns the lock again (before: the thread
    died at the cut and this replica fired no cron again)."""
    url = urlsplit(redis_url)
    keys = Keys(f"{new_namespace()}:toolfleet:")
    with CutProxy(url.hostname or "127.0.0.1", url.port or 6379) as link:
        settings = Settings(broker_url=proxied(redis_url, link.port))

        async def scenario() -> None:
            beat = CronBeat(settings, keys, None, None, lambda *a: None)  # type: ignore[arg-type]
            beat.start()
            try:
                first = await asyncio.to_thread(acquired, beat, 30)
                await asyncio.to_thread(link.cut)
                await asyncio.sleep(BEAT_INTERVAL + 2)
                await asyncio.to_thread(link.heal)
                await asyncio.to_thread(acquired, beat, LOCK_SECONDS + 30, first)
            finally:
                await beat.close()

        asyncio.run(scenario())
    client = redis.Redis.from_url(redis_url)
    try:
        stale = list(client.scan_iter(f"{keys.base}*"))
        if stale:
            client.delete(*stale)
    finally:
        client.close()
