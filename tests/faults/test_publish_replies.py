"""Publishing when Redis's replies are lost: a write that reached Redis but whose reply
never came back (a link cut one way, a timeout just after the server acted).

The claim of a call and the marking of a published call are the two writes around a
publication when the markers live on another Redis than the broker's; on the broker's own
Redis both are one script. Their replies are dropped here by a client wrapper, after the
commands ran on the real Redis, as a one-way cut (Redis -> orchestrator) does; the worker
is real, and each call's runs are counted in Redis by the tool.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import pytest
import redis

from orchestrator.calls import PreparedCall
from orchestrator.dispatch import publish as publish_module
from orchestrator.dispatch.celery import CeleryDispatcher
from tests.support.fleet import effects
from tool_workers.contract.broker import create_app
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


class LostReplies:
    """A Redis client whose pipelines run on the server, but the replies of the first
    ``lose`` whose values include ``value`` are lost (``redis.TimeoutError``)."""

    def __init__(self, client: redis.Redis, value: str, lose: int) -> None:
        self._client = client
        self.value = value
        self.lose = lose
        self.lost = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> _Pipeline:
        return _Pipeline(self, self._client.pipeline(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _Pipeline:
    def __init__(self, owner: LostReplies, pipe: Any) -> None:
        self._owner = owner
        self._pipe = pipe
        self._values: list[Any] = []

    def set(self, name: str, value: Any, **kwargs: Any) -> _Pipeline:
        self._values.append(value)
        self._pipe.set(name, value, **kwargs)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)

    def execute(self) -> list[Any]:
        replies: list[Any] = self._pipe.execute()
        owner = self._owner
        if owner.lost < owner.lose and any(str(v).startswith(owner.value) for v in self._values):
            owner.lost += 1
            raise redis.TimeoutError("Timeout reading from socket (reply lost)")
        return replies

    def __enter__(self) -> _Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pipe.reset()


def call(tag: str) -> PreparedCall:
    return PreparedCall(
        tool="slow_effect",
        call_id=tag,
        args={"seconds": 0.2, "tag": tag},
        task_id=task_id_for(f"lost-replies-{tag}"),
    )


class LostScriptReplies:
    """The publisher's claim-and-push script, run on the server, its first ``lose``
    replies lost (``redis.TimeoutError``)."""

    def __init__(self, client: redis.Redis, source: str, lose: int) -> None:
        self._script = client.register_script(source)
        self.lose = lose
        self.lost = 0

    def __call__(self, **kwargs: Any) -> Any:
        reply = self._script(**kwargs)
        if self.lost < self.lose:
            self.lost += 1
            raise redis.TimeoutError("Timeout reading from socket (reply lost)")
        return reply


def run_with_lost_replies(
    settings: Settings, value: str, lose: int, counter: redis.Redis
) -> tuple[list[str], LostReplies | LostScriptReplies]:
    """Publish three calls through a dispatcher whose publisher loses replies; their
    results. ``value`` ``"script"`` loses the one-script publication's replies; any other
    the replies of the two-step path's writes of that value (``pending``: the claim,
    ``sent``: the marking)."""
    app = create_app(settings)
    dispatcher = CeleryDispatcher(app, settings)
    publisher = dispatcher._publisher
    flaky: LostReplies | LostScriptReplies
    if value == "script":
        assert publisher._one_trip, "the markers are expected on the broker's Redis"
        flaky = LostScriptReplies(publisher._client, publish_module._CLAIM_AND_PUSH, lose)
        publisher._claim_and_push = flaky
    else:
        publisher._one_trip = False  # the two-step path of markers on another Redis
        flaky = LostReplies(publisher._client, value, lose)
        publisher._client = flaky  # type: ignore[assignment]
    calls = [call(f"r{i}") for i in range(3)]
    try:
        dispatcher.submit(calls)
        results = [dispatcher.wait(c, timeout=30).content for c in calls]
    finally:
        dispatcher.close()
        app.close()
    assert flaky.lost == lose
    runs = effects(counter, settings, "slow_effect")
    assert sorted(runs) == sorted(c.task_id for c in calls), runs
    assert set(runs.values()) == {1}, runs  # each call ran exactly once
    return results, flaky


def test_a_claim_whose_reply_was_lost_is_still_published(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any], counter: Any
) -> None:
    """Given a fan-out whose claim reached Redis but whose reply was lost, when the
    publisher retries the claim, then it recognises the claims as its own and publishes
    the calls now (not after the claims expire): every call is answered, once."""
    settings = fault_settings()
    start_worker(settings, pool="threads", concurrency=4)
    results, _ = run_with_lost_replies(settings, "pending", 1, counter)
    assert results == ["done r0 (run 1)", "done r1 (run 1)", "done r2 (run 1)"], results


def test_calls_published_before_the_link_failed_are_waited_for(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any], counter: Any
) -> None:
    """Given calls that reached the broker, when marking them published fails (the link
    went down just after the publication), then the dispatch does not fail the run (the
    calls run, so raising would leave them without a waiter): every call is answered
    with its real result, and none runs twice."""
    settings = fault_settings()
    start_worker(settings, pool="threads", concurrency=4)
    results, _ = run_with_lost_replies(settings, "sent", 3, counter)
    assert results == ["done r0 (run 1)", "done r1 (run 1)", "done r2 (run 1)"], results


def test_a_one_script_publication_whose_reply_was_lost_is_waited_for(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any], counter: Any
) -> None:
    """Given a fan-out claimed and published in one script whose reply was lost, when the
    publisher runs the script again, then it finds the calls claimed (by its own lost
    attempt) and waits for them instead of publishing them twice: every call is
    answered with its real result, once."""
    settings = fault_settings()
    start_worker(settings, pool="threads", concurrency=4)
    results, _ = run_with_lost_replies(settings, "script", 1, counter)
    assert results == ["done r0 (run 1)", "done r1 (run 1)", "done r2 (run 1)"], results
