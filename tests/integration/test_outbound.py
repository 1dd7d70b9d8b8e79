"""The outbound client bounds what a user-named receiver can cost ``toolfleet serve``:
an endless answer is cut (memory stays flat), a trickled one ends at the try's
deadline, and one tenant's receivers that never answer leave the other tenants' webhooks
their connections."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from orchestrator.server.keys import Keys
from orchestrator.server.webhooks import WebhookSender
from tests.support.fleet import new_namespace
from tests.support.hostile import HostileReceiver
from tests.support.receiver import Receiver
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _body() -> dict[str, Any]:
    return {"run_id": str(uuid.uuid4()), "status": "success", "values": {"n": 1}}


@asynccontextmanager
async def _sender(redis_url: str, **settings: Any) -> AsyncIterator[WebhookSender]:
    values: dict[str, Any] = {"webhook_allowed_hosts": ("127.0.0.1:*",), "webhook_attempts": 1}
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    sender = WebhookSender(
        client, Keys(f"{new_namespace()}:toolfleet:"), Settings(**{**values, **settings})
    )
    try:
        yield sender
    finally:
        await sender.close(0.5)
        await client.aclose()


def _outcome(sender: WebhookSender, outcome: str) -> float:
    for metric in sender.deliveries.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("outcome") == outcome:
                return float(sample.value)
    return 0.0


async def _until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_an_endless_answer_is_cut_and_memory_stays_flat(redis_url: str) -> None:
    """Given a receiver answering 200 with a body that does not end (256 MiB, then
    silence), when a webhook is delivered there, then the delivery counts as delivered
    within the try's deadline and the process grows by less than 32 MiB."""
    receiver = HostileReceiver("endless")

    async def main() -> tuple[bool, int, float]:
        async with _sender(redis_url, webhook_timeout=10.0) as sender:
            base = peak = _rss()
            started = time.monotonic()
            sender.send(receiver.url(), _body(), tenant="t1")

            def done() -> bool:
                nonlocal peak
                peak = max(peak, _rss())
                return _outcome(sender, "delivered") + _outcome(sender, "failed") >= 1

            ended = await _until(done, 15.0)
            return (
                ended and _outcome(sender, "delivered") == 1,
                peak - base,
                time.monotonic() - started,
            )

    try:
        delivered, growth, took = asyncio.run(main())
    finally:
        receiver.close()
    assert delivered, took
    assert growth < 32 * 1024 * 1024, growth
    assert took < 10.0


def test_a_trickled_answer_ends_at_the_deadline_of_the_try(redis_url: str) -> None:
    """Given a receiver sending its answer a byte a second, when a webhook with a 2 s
    try goes there, then the try ends (failed) at its deadline, not when a read
    times out."""
    receiver = HostileReceiver("trickle")

    async def main() -> tuple[bool, float]:
        async with _sender(redis_url, webhook_timeout=2.0) as sender:
            started = time.monotonic()
            sender.send(receiver.url(), _body(), tenant="t1")
            ended = await _until(lambda: _outcome(sender, "failed") >= 1, 12.0)
            return ended, time.monotonic() - started

    try:
        ended, took = asyncio.run(main())
    finally:
        receiver.close()
    assert ended, took
    assert 2.0 <= took < 4.0, took


def test_a_tenants_silent_receivers_leave_the_others_their_connections(redis_url: str) -> None:
    """Given tenant a's 120 webhooks to a receiver that never answers (tries of 30 s),
    when tenant b's webhook goes to a receiver that answers, then b's is delivered at
    once while a's still hang, and a holds at most its share of the pool."""
    silent, good = HostileReceiver("silent"), Receiver()

    async def main() -> tuple[bool, int]:
        async with _sender(redis_url, webhook_timeout=30.0) as sender:
            for _ in range(120):
                sender.send(silent.url(), _body(), tenant="a")
            await _until(lambda: silent.connections >= 20, 10.0)
            await asyncio.sleep(0.5)  # what a could take, it has taken
            sender.send(good.url(), _body(), tenant="b")
            delivered = await _until(lambda: _outcome(sender, "delivered") >= 1, 5.0)
            return delivered, silent.connections

    try:
        delivered, held = asyncio.run(main())
    finally:
        silent.close()
        good.close()
    assert delivered
    assert len(good.deliveries) == 1
    assert held <= 50, held
