"""The one backoff every reconnect and retry against Redis waits by."""

from __future__ import annotations

import ast
import asyncio
import random
import time
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from orchestrator.backoff import CAP, FIRST, Backoff, retried

REPO = Path(__file__).resolve().parents[2]

USERS = (
    "orchestrator/dispatch/publish.py",
    "orchestrator/dispatch/registry.py",
    "orchestrator/server/eventlog.py",
)
"""The modules that retry against Redis."""


def delays(backoff: Backoff, count: int) -> list[float]:
    return [backoff.next() for _ in range(count)]


def test_given_the_widest_jitter_then_delays_double_from_the_first_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(random, "random", lambda: 1.0)

    assert delays(Backoff(), 8) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])


def test_given_many_failures_then_every_delay_is_within_zero_and_the_cap() -> None:
    backoff = Backoff()

    assert all(0 <= d <= CAP for d in delays(backoff, 5000))
    assert (FIRST, CAP) == (0.1, 2.0)


def test_given_two_policies_then_their_delays_differ() -> None:
    assert delays(Backoff(), 10) != delays(Backoff(), 10)


def test_given_many_failures_then_delays_at_the_cap_stay_jittered() -> None:
    backoff = Backoff()
    delays(backoff, 10)

    late = delays(backoff, 200)
    assert max(late) == pytest.approx(CAP)
    assert len({round(d, 3) for d in late}) > 50  # not all the cap: still spread out


def test_given_a_reset_then_the_next_delay_is_a_first_one_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(random, "random", lambda: 1.0)
    backoff = Backoff()
    delays(backoff, 6)

    backoff.reset()

    assert delays(backoff, 2) == pytest.approx([0.1, 0.2])


def test_given_a_deadline_then_no_delay_passes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 1.0)
    backoff = Backoff(until=time.monotonic() + 0.5)
    delays(backoff, 4)  # 0.1 + 0.2 + 0.4 + 0.8, none slept

    assert backoff.next() <= 0.5


def test_given_a_past_deadline_then_no_delay() -> None:
    assert Backoff(until=time.monotonic() - 1).next() == 0.0


@pytest.mark.parametrize("path", USERS)
def test_given_a_module_that_retries_then_it_waits_by_the_shared_backoff(path: str) -> None:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))

    imports = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert ("orchestrator.backoff", "Backoff") in imports
    doubled = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and isinstance(node.right, ast.Constant)
        and node.right.value == 2
    ]
    assert doubled == []  # no delay of its own, doubled


def test_given_a_link_lost_twice_then_retried_returns_the_third_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)  # no delay
    tries: list[int] = []

    async def attempt(n: int) -> str:
        tries.append(n)
        if n < 2:
            raise RedisConnectionError("reset")
        return "done"

    assert asyncio.run(retried(attempt, within=5, what="a test")) == "done"
    assert tries == [0, 1, 2]


def test_given_an_error_of_the_command_then_retried_raises_it_at_once() -> None:
    tries: list[int] = []

    async def attempt(n: int) -> None:
        tries.append(n)
        raise ResponseError("WRONGTYPE")

    with pytest.raises(ResponseError):
        asyncio.run(retried(attempt, within=5, what="a test"))
    assert tries == [0]
