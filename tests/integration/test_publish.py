"""The publisher against a real Redis: each call on its queue at most once, whoever asks.

No worker runs here: each test publishes into its own namespace and reads the queue's
list and the calls' markers back.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from orchestrator.call import PreparedCall
from orchestrator.dispatch.loop_redis import LoopClients
from orchestrator.dispatch.publish import Outcome, Publisher
from tool_workers.contract.connections import async_redis_client
from tool_workers.contract.marker import CallMarker, marker_key
from tool_workers.contract.names import queue_key, result_key
from tool_workers.contract.settings import Settings


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(redis_url: str, settings: Settings) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    for key in made.scan_iter(f"{settings.namespace}:*"):
        made.delete(key)
    made.close()


def publisher_for(settings: Settings, client: Any) -> Publisher:
    return Publisher(
        settings,
        client,
        LoopClients(lambda: async_redis_client(settings.backend_url, settings)),
        f"{settings.key_prefix}reply:test",
        functools.partial(result_key, settings.namespace),
        functools.partial(queue_key, settings.namespace),
        "tools",
    )


def call(n: int) -> PreparedCall:
    return PreparedCall(
        tool="echo", call_id=f"c{n}", args={"text": str(n)}, task_id=f"task-{n}", thread_id="th"
    )


def queued(client: redis.Redis, settings: Settings) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(queue_key(settings.namespace, "tools"), 0, -1)]


def test_given_fresh_calls_when_published_then_each_on_the_queue_once_and_marked(
    client: redis.Redis, settings: Settings
) -> None:
    publisher = publisher_for(settings, client)

    outcomes = publisher.publish([call(1), call(2)])
    again = publisher_for(settings, client).publish([call(1), call(2)])  # another process

    assert outcomes == {"task-1": Outcome.PUBLISHED, "task-2": Outcome.PUBLISHED}
    assert again == {"task-1": Outcome.ATTACHED, "task-2": Outcome.ATTACHED}
    assert sorted(m["headers"]["id"] for m in queued(client, settings)) == ["task-1", "task-2"]
    marker = CallMarker.parse(client.get(marker_key(settings.key_prefix, "task-1")))
    assert marker is not None and marker.token and not marker.pending


def test_given_a_stored_result_when_published_then_nothing_is_sent(
    client: redis.Redis, settings: Settings
) -> None:
    client.set(result_key(settings.namespace, "task-1"), '{"status": "SUCCESS"}')

    outcomes = publisher_for(settings, client).publish([call(1)])

    assert outcomes == {"task-1": Outcome.STORED}
    assert queued(client, settings) == []


class LosesReplies:
    """A Redis client whose first ``lose`` script runs happen on the server, but whose
    replies are lost (``redis.TimeoutError``), as on a link cut one way."""

    def __init__(self, client: redis.Redis, lose: int) -> None:
        self._client = client
        self.lose = lose

    def register_script(self, script: str) -> Any:
        inner = self._client.register_script(script)
        owner = self

        class Script:
            sha = inner.sha
            script = inner.script

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                reply = inner(*args, **kwargs)
                if owner.lose:
                    owner.lose -= 1
                    raise redis.TimeoutError("reply lost")
                return reply

        return Script()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_given_a_publication_whose_reply_was_lost_then_the_retry_counts_it_published_once(
    client: redis.Redis, settings: Settings
) -> None:
    publisher = publisher_for(settings, LosesReplies(client, lose=1))

    outcomes = publisher.publish([call(1), call(2)])

    assert outcomes == {"task-1": Outcome.PUBLISHED, "task-2": Outcome.PUBLISHED}
    assert sorted(m["headers"]["id"] for m in queued(client, settings)) == ["task-1", "task-2"]


def test_given_no_marker_and_no_result_then_abandoned(
    client: redis.Redis, settings: Settings
) -> None:
    publisher = publisher_for(settings, client)
    assert publisher.abandoned(call(1))

    publisher.publish([call(1)])

    assert not publisher.abandoned(call(1))


def test_given_a_revocation_then_the_marker_says_so_and_keeps_the_rest(
    client: redis.Redis, settings: Settings
) -> None:
    publisher = publisher_for(settings, client)
    publisher.publish([call(1)])

    publisher.record_revoked(["task-1", "task-9"])

    kept = CallMarker.parse(client.get(marker_key(settings.key_prefix, "task-1")))
    new = CallMarker.parse(client.get(marker_key(settings.key_prefix, "task-9")))
    assert kept is not None and kept.revoked and kept.token
    assert new is not None and new.revoked
    assert client.ttl(marker_key(settings.key_prefix, "task-9")) > 0


def test_given_async_calls_of_one_loop_turn_then_one_batch_published_on_the_loop(
    client: redis.Redis, settings: Settings
) -> None:
    publisher = publisher_for(settings, client)
    batches: list[int] = []
    push = publisher._push_on_loop

    async def counted(calls: Any) -> Any:
        batches.append(len(calls))
        return await push(calls)

    publisher._push_on_loop = counted  # type: ignore[method-assign]

    async def fan_out() -> list[Outcome]:
        return list(await asyncio.gather(*(publisher.publish_async(call(n)) for n in range(6))))

    outcomes = asyncio.run(fan_out())

    assert outcomes == [Outcome.PUBLISHED] * 6
    assert batches == [6]
    assert len(queued(client, settings)) == 6


def test_given_many_threads_publishing_at_once_then_each_call_once_in_few_batches(
    client: redis.Redis, settings: Settings
) -> None:
    import threading

    publisher = publisher_for(settings, client)
    batches: list[int] = []
    publish_now = publisher._publish_now

    def counted(calls: Any) -> Any:
        batches.append(len(calls))
        return publish_now(calls)

    publisher._publish_now = counted  # type: ignore[method-assign]
    go = threading.Barrier(20)

    def one(n: int) -> None:
        go.wait()
        publisher.publish([call(n)])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(batches) == 20 and len(batches) < 20
    assert sorted(m["headers"]["id"] for m in queued(client, settings)) == sorted(
        f"task-{n}" for n in range(20)
    )
