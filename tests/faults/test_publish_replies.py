"""Publishing when Redis's replies are lost: a write that reached Redis but whose reply
never came back (a link cut one way, a timeout just after the server acted).

On a Redis broker a publication is one script (marker and message together); on
RabbitMQ the claim and the marking of a published call are two scripts around the
publication. Their replies are dropped here by a wrapper, after the script ran on the
real Redis, as a one-way cut (Redis -> orchestrator) does; the worker is real, and each
call's runs are counted in Redis by the tool.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from orchestrator.call import PreparedCall
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from tests.support.fleet import effects
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def call(tag: str) -> PreparedCall:
    return PreparedCall(
        tool="slow_effect",
        call_id=tag,
        args={"seconds": 0.2, "tag": tag},
        task_id=task_id_for(f"lost-replies-{tag}-{uuid.uuid4().hex}"),
    )


class LostScriptReplies:
    """A publisher's script, run on the server, its first ``lose`` replies lost
    (``redis.TimeoutError``)."""

    def __init__(self, script: Any, lose: int) -> None:
        self._script = script
        self.sha = script.sha
        self.script = script.script
        self.lose = lose
        self.lost = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reply = self._script(*args, **kwargs)
        if self.lost < self.lose:
            self.lost += 1
            raise redis.TimeoutError("Timeout reading from socket (reply lost)")
        return reply


def run_with_lost_replies(
    settings: Settings, script: str, lose: int, counter: redis.Redis
) -> list[str]:
    """Publish three calls through a dispatcher whose publisher loses the replies of its
    ``script`` (``_push``: the publication's claim, on Redis with the messages;
    ``_mark_sent``: RabbitMQ's marking); their results."""
    dispatcher = CeleryDispatcher(None, settings)
    publisher = dispatcher._publisher
    flaky = LostScriptReplies(getattr(publisher, script), lose)
    setattr(publisher, script, flaky)
    calls = [call(f"r{i}") for i in range(3)]
    try:
        dispatcher.submit(calls)
        results = [str(dispatcher.wait(c, timeout=30).content) for c in calls]
    finally:
        dispatcher.close()
    assert flaky.lost == lose
    runs = effects(counter, settings, "slow_effect")
    assert sorted(runs) == sorted(c.task_id for c in calls), runs
    assert set(runs.values()) == {1}, runs  # each call ran exactly once
    return results


EXPECTED = ["done r0 (run 1)", "done r1 (run 1)", "done r2 (run 1)"]


def test_a_publication_whose_reply_was_lost_is_published_once(
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
    broker: str,
    broker_settings: dict[str, Any],
) -> None:
    """Given a fan-out whose publication (Redis: its one script; RabbitMQ: its claim)
    reached Redis but whose reply was lost, when the publisher tries again, then it
    recognises the calls as its own and counts them published (not attached to, not
    published twice): every call is answered, once."""
    settings = fault_settings(**broker_settings)
    start_worker(settings, pool="threads", concurrency=4)
    script = "_push"
    assert run_with_lost_replies(settings, script, 1, counter) == EXPECTED


def test_calls_published_before_the_link_failed_are_waited_for(
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
    broker: str,
    broker_settings: dict[str, Any],
) -> None:
    """Given calls that reached the broker, when the replies keep being lost (Redis: the
    publication's, three times; RabbitMQ: the marking after the publication, past its
    retries), then the dispatch does not fail the run (the calls run, so raising would
    leave them without a waiter): every call is answered with its real result, and none
    runs twice."""
    settings = fault_settings(**broker_settings)
    start_worker(settings, pool="threads", concurrency=4)
    script = "_push" if broker == "redis" else "_mark_sent"
    assert run_with_lost_replies(settings, script, 3, counter) == EXPECTED
