"""A run's webhook is delivered once, whichever senders try: the claim in Redis."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio as aioredis

from orchestrator.server.keys import Keys
from orchestrator.server.webhooks import WebhookSender
from tests.support.fleet import new_namespace
from tests.support.receiver import Receiver
from tool_workers.contract.settings import Settings


def test_a_run_is_delivered_once_whoever_sends_it(redis_url: str) -> None:
    """Given two senders (two replicas) on one Redis, when both send the same run's
    webhook, one of them twice, then the receiver gets it once, and one sender counts
    it delivered."""
    receiver = Receiver()
    settings = Settings(webhook_allowed_hosts=("127.0.0.1:*",), webhook_attempts=1)
    keys = Keys(f"{new_namespace()}:toolfleet:")
    body = {"run_id": str(uuid.uuid4()), "status": "success", "values": {"n": 1}}

    async def main() -> list[float]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        one, two = WebhookSender(client, keys, settings), WebhookSender(client, keys, settings)
        try:
            for sender in (one, two, one):
                sender.send(receiver.url(), body)
            await one.close(10.0)
            await two.close(10.0)
            await client.delete(f"{keys.base}webhook-sent:{body['run_id']}")
        finally:
            await client.aclose()
        return [_delivered(sender) for sender in (one, two)]

    try:
        delivered = asyncio.run(main())
        time.sleep(0.5)
        assert len(receiver.deliveries) == 1
        assert receiver.deliveries[0].json()["run_id"] == body["run_id"]
        assert sorted(delivered) == [0.0, 1.0]
    finally:
        receiver.close()


def _delivered(sender: WebhookSender) -> float:
    """The sender's count of delivered webhooks, as /metrics shows it."""
    for metric in sender.deliveries.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("outcome") == "delivered":
                return float(sample.value)
    return 0.0
