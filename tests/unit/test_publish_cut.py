"""Publishing and cancelling through a cut: the run's deadline bounds every wait on Redis.

A *silent* Redis is a listening socket that never answers (a cut link looks like this
to the client: connects may complete, replies never come); a *refusing* one is a closed
port (Redis down: every try fails at once). No Redis server is needed.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.call import PreparedCall
from orchestrator.dispatch import publish
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.dispatch.loop_redis import LoopClients
from orchestrator.dispatch.publish import Publisher
from orchestrator.dispatch.transport import REVOKE_WAIT
from tool_workers.contract.connections import async_redis_client, redis_client
from tool_workers.contract.errors import DispatchError, ResultTimeout
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(60)

KEPT = 1.5
"""Seconds past its deadline a wait may end (the bound is the point of these tests)."""


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A Redis URL whose server accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


@pytest.fixture
def refusing_redis() -> str:
    """A Redis URL whose port refuses connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def settings_for(url: str, tmp_path: Path) -> Settings:
    policy = tmp_path / "toolfleet.toml"
    policy.write_text("")
    return Settings(broker_url=url, namespace="cut", config=policy)


def publisher_for(url: str, tmp_path: Path) -> Publisher:
    settings = settings_for(url, tmp_path)
    return Publisher(
        settings,
        redis_client(url, settings),
        LoopClients(lambda: async_redis_client(url, settings)),
        "toolfleet:reply:test",
        lambda task_id: f"celery-task-meta-{task_id}",
        lambda queue: queue,
        "tools",
    )


def call(deadline_in: float | None) -> PreparedCall:
    deadline = None if deadline_in is None else time.monotonic() + deadline_in
    return PreparedCall(tool="step", call_id="c1", args={}, task_id="t-c1", deadline=deadline)


def test_a_sync_publication_on_a_silent_link_ends_at_its_runs_deadline(
    silent_redis: str, tmp_path: Path
) -> None:
    """Given a link that swallows every command, when a call with 1.5 s left to its run's
    deadline is published, then the publication gives up at the deadline (not after the
    socket timeouts and the retry window), naming the cut."""
    publisher = publisher_for(silent_redis, tmp_path)
    t0 = time.monotonic()
    try:
        with pytest.raises(ResultTimeout, match="not published by the run's deadline"):
            publisher.publish([call(1.5)])
    finally:
        publisher.close()
    assert time.monotonic() - t0 < 1.5 + KEPT


def test_an_async_publication_on_a_silent_link_ends_at_its_runs_deadline(
    silent_redis: str, tmp_path: Path
) -> None:
    """The same, on an event loop."""
    publisher = publisher_for(silent_redis, tmp_path)

    async def publish_one() -> None:
        await publisher.publish_async(call(1.5))

    t0 = time.monotonic()
    try:
        with pytest.raises(ResultTimeout, match="not published by the run's deadline"):
            asyncio.run(publish_one())
    finally:
        publisher.close()
    assert time.monotonic() - t0 < 1.5 + KEPT


def test_a_publication_with_a_deadline_retries_past_the_window_of_one_without(
    refusing_redis: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given Redis down, when a call without a run deadline is published, then it fails
    with DispatchError after the retry window, saying how long Redis was unreachable;
    when a call whose run has a later deadline is, then it retries until that deadline."""
    monkeypatch.setattr(publish, "RETRY_SECONDS", 0.5)
    publisher = publisher_for(refusing_redis, tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(DispatchError, match=r"Redis unreachable for \d"):
            publisher.publish([call(None)])
        assert time.monotonic() - t0 < 0.5 + KEPT
        t0 = time.monotonic()
        with pytest.raises(ResultTimeout, match="Redis unreachable"):
            publisher.publish([call(2.5)])
        waited = time.monotonic() - t0
    finally:
        publisher.close()
    assert 2.5 - 0.2 <= waited < 2.5 + KEPT


def test_a_cancellation_on_a_silent_link_does_not_hold_up_its_caller(
    silent_redis: str, tmp_path: Path
) -> None:
    """Given a link that swallows every command, when calls are cancelled (a run's
    deadline passed), then the cancellation returns within REVOKE_WAIT, sync and async;
    the revocation goes on in the background."""
    dispatcher = CeleryDispatcher(None, settings_for(silent_redis, tmp_path))
    dispatcher._sent["t-c1"] = None  # published earlier: a cancellation revokes it
    try:
        t0 = time.monotonic()
        dispatcher.cancel([call(None)])
        assert time.monotonic() - t0 < REVOKE_WAIT + KEPT
        dispatcher._sent["t-c1"] = None
        t0 = time.monotonic()
        asyncio.run(dispatcher.cancel_async([call(None)]))
        assert time.monotonic() - t0 < REVOKE_WAIT + KEPT
    finally:
        dispatcher.close()
