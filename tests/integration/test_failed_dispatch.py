"""A run whose fan-out could not be published: it fails with DispatchError and leaves
nothing behind that would stop a resume from running its calls.

When the publication of a fan-out fails, every call of the batch fails with it; LangGraph
then cancels the Send tasks still unwinding. A call cancelled after its publication
failed has nothing on the queue from this process to revoke, and a revocation recorded
for it would answer the resumed call "cancelled" without running it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from orchestrator import CeleryToolMiddleware
from orchestrator.call import PreparedCall
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from tests import fleet_tools
from tests.support.fleet import one_turn
from tool_workers.contract.broker import create_app
from tool_workers.contract.errors import DispatchError
from tool_workers.contract.marker import CallMarker, marker_key
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)

CALLS = 12


class FailingPublications:
    """Makes a dispatcher's publications fail (after a moment, as a cut link does), the
    blocking ones and those on an event loop alike."""

    def __init__(self, dispatcher: CeleryDispatcher) -> None:
        self.failing = True
        self.publishing = threading.Event()
        publisher = dispatcher._publisher
        self._publish_now = publisher._publish_now
        self._push_on_loop = publisher._push_on_loop
        publisher._publish_now = self  # type: ignore[method-assign]
        publisher._push_on_loop = self.on_loop  # type: ignore[method-assign]

    def __call__(self, calls: Any) -> Any:
        if not self.failing:
            return self._publish_now(calls)
        self.publishing.set()
        time.sleep(0.5)
        raise redis.ConnectionError("Redis unreachable")

    async def on_loop(self, calls: Any) -> Any:
        if not self.failing:
            return await self._push_on_loop(calls)
        self.publishing.set()
        await asyncio.sleep(0.5)
        raise redis.ConnectionError("Redis unreachable")


@pytest.fixture
def dispatcher(shared_fleet: Settings) -> Iterator[CeleryDispatcher]:
    """A dispatcher of its own (its publications are made to fail)."""
    dispatcher = CeleryDispatcher(create_app(shared_fleet), shared_fleet, owns_app=True)
    yield dispatcher
    dispatcher.close()


def revoked(settings: Settings, client: redis.Redis, task_id: str) -> bool:
    """Whether the call's marker records a revocation."""
    marker = CallMarker.parse(client.get(marker_key(settings.key_prefix, task_id)))
    return marker is not None and marker.revoked


def revocations(settings: Settings, client: redis.Redis) -> set[bytes]:
    """The calls of the fleet's namespace whose markers record a revocation (the namespace
    is shared with other tests: compare before and after)."""
    keys = list(client.scan_iter(marker_key(settings.key_prefix, "*")))
    return {
        key
        for key, raw in zip(keys, client.mget(keys) if keys else [], strict=True)
        if (marker := CallMarker.parse(raw)) is not None and marker.revoked
    }


def test_a_fan_out_whose_publication_failed_is_resumed_with_every_call_run(
    shared_fleet: Settings, dispatcher: CeleryDispatcher, counter: redis.Redis
) -> None:
    """Given an async run whose fan-out of 12 calls could not be published (the run fails
    with DispatchError), when the thread is resumed once publishing works again, then
    no call was revoked and every call is answered with its real result."""
    failing = FailingPublications(dispatcher)
    before = revocations(shared_fleet, counter)
    calls = [("sleep_for", {"seconds": 0.1, "label": f"c{i}"}) for i in range(CALLS)]
    agent = create_agent(
        one_turn(calls),
        [fleet_tools.sleep_for],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
        checkpointer=InMemorySaver(),
    )
    config: dict[str, Any] = {"configurable": {"thread_id": f"failed-{shared_fleet.namespace}"}}

    with pytest.raises(DispatchError):
        asyncio.run(agent.ainvoke({"messages": [("user", "go")]}, config))
    assert revocations(shared_fleet, counter) == before

    failing.failing = False
    state = asyncio.run(agent.ainvoke(None, config))
    answers = {m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    assert answers == {f"c{i} 0.1" for i in range(CALLS)}


def test_cancelling_calls_whose_publication_failed_records_no_revocation(
    shared_fleet: Settings, dispatcher: CeleryDispatcher, counter: redis.Redis
) -> None:
    """Given async calls whose batch publication failed, when they are cancelled (as
    LangGraph cancels the Send tasks of a failed step) after the failure or while the
    publication was still trying, then no revocation is recorded; a call that was
    published is still revoked when cancelled."""
    failing = FailingPublications(dispatcher)
    after = [call(f"after-{i}") for i in range(3)]
    during = [call(f"during-{i}") for i in range(3)]

    async def fail_then_cancel() -> list[BaseException | None]:
        outcomes = await asyncio.gather(
            *(dispatcher.submit_async(c) for c in after), return_exceptions=True
        )
        await dispatcher.cancel_async(after)
        return outcomes

    async def cancel_while_publishing() -> None:
        failing.publishing.clear()
        tasks = [asyncio.create_task(dispatcher.submit_async(c)) for c in during]
        while not failing.publishing.is_set():
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await dispatcher.cancel_async(during)
        await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(fail_then_cancel())
    assert all(isinstance(o, DispatchError) for o in outcomes), outcomes
    asyncio.run(cancel_while_publishing())
    found = [revoked(shared_fleet, counter, c.task_id) for c in [*after, *during]]
    assert found == [False] * 6

    failing.failing = False
    published = call("sent")

    async def publish_then_cancel() -> None:
        await dispatcher.submit_async(published)
        await dispatcher.cancel_async([published])

    asyncio.run(publish_then_cancel())
    assert revoked(shared_fleet, counter, published.task_id)


def call(label: str) -> PreparedCall:
    return PreparedCall(
        tool="sleep_for",
        call_id=label,
        args={"seconds": 3, "label": label},
        task_id=f"failed-dispatch-{label}-{uuid.uuid4().hex}",
    )
