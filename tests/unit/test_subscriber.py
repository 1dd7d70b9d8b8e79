"""One pub/sub subscription kept up (orchestrator.backoff): every subscriber of the
orchestrator and the service uses it, and it resubscribes after a loss, announcing each
subscription so its user catches up."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator.backoff import subscribe_forever

REPO = Path(__file__).resolve().parents[2]

SUBSCRIBERS = ("orchestrator/dispatch/listener.py", "orchestrator/server/control.py")
"""The modules that listen on a pub/sub channel."""


class FakePubSub:
    def __init__(self, fail: bool, messages: list[Any]) -> None:
        self.fail = fail
        self.messages = messages
        self.closed = False

    async def subscribe(self, channel: str) -> None:
        if self.fail:
            raise RedisConnectionError("connection refused")
        self.messages.insert(0, {"type": "subscribe", "channel": channel, "data": 1})

    async def get_message(self, timeout: float) -> dict[str, Any] | None:
        if self.messages:
            item = self.messages.pop(0)
            if isinstance(item, Exception):
                raise item
            return item
        await asyncio.sleep(0)  # a read that timed out: the loop goes on
        return None

    async def aclose(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, sessions: list[FakePubSub]) -> None:
        self.sessions = sessions
        self.opened: list[FakePubSub] = []

    def pubsub(self) -> FakePubSub:
        session = self.sessions.pop(0)
        self.opened.append(session)
        return session


def test_given_a_lost_subscription_then_it_subscribes_again_and_says_so_each_time() -> None:
    """Given a server that refuses the first subscription and drops the second after one
    message, when the subscriber runs, then every message is handed on, each loss is
    reported, each subscription is announced (where its user catches up), and every
    pub/sub connection it opened is closed."""
    lost = RedisConnectionError("connection reset")
    client = FakeClient(
        [
            FakePubSub(True, []),
            FakePubSub(False, [{"type": "message", "data": b"one"}, lost]),
            FakePubSub(False, [{"type": "message", "data": b"two"}]),
        ]
    )
    heard: list[Any] = []
    events: list[str] = []

    async def main() -> None:
        await asyncio.wait_for(
            subscribe_forever(
                client,
                "replies",
                heard.append,
                what="test channel",
                on_subscribed=lambda: events.append("subscribed"),
                on_lost=lambda exc: events.append(f"lost {type(exc).__name__}"),
                stopping=lambda: heard == [b"one", b"two"],
            ),
            timeout=10,
        )

    asyncio.run(main())
    assert heard == [b"one", b"two"]
    assert events == ["lost ConnectionError", "subscribed", "lost ConnectionError", "subscribed"]
    assert all(session.closed for session in client.opened)


def test_every_subscriber_uses_the_one_subscription_loop() -> None:
    """Given the modules that listen on a channel, then each goes through
    ``subscribe_forever`` and none opens a pub/sub of its own."""
    for path in SUBSCRIBERS:
        source = (REPO / path).read_text(encoding="utf-8")
        tree = ast.parse(source)
        called = {
            node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "subscribe_forever" in called, path
        assert ".pubsub(" not in source, path


class SwallowingPubSub(FakePubSub):
    """A read that turns a cancellation into a timeout, as redis-py's may when the
    cancellation meets the end of the read's own timeout."""

    def __init__(self) -> None:
        super().__init__(False, [])
        self.swallow = True
        self.reading = asyncio.Event()

    async def get_message(self, timeout: float) -> dict[str, Any] | None:
        if self.messages:
            return await super().get_message(timeout)
        self.reading.set()
        try:
            await asyncio.Event().wait()  # a read in progress, until it is cancelled
        except asyncio.CancelledError:
            if not self.swallow:
                raise
        return None


def test_given_a_cancellation_a_read_swallows_then_the_subscription_still_ends() -> None:
    """Given a subscriber without a stop condition (the control channel's), when its task
    is cancelled while a read swallows the cancellation, then it ends all the same (before:
    it read on forever, and a replica's shutdown waited for it forever)."""
    session = SwallowingPubSub()
    client = FakeClient([session])

    async def main() -> bool:
        task = asyncio.create_task(
            subscribe_forever(client, "control", lambda _: None, what="test channel")
        )
        await session.reading.wait()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        if not done:  # end the runaway loop, so that the test ends
            session.swallow = False
            task.cancel()
            await asyncio.wait({task}, timeout=2)
        return task in done

    assert asyncio.run(main())
    assert session.closed
