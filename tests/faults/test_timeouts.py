"""Hung tools, time limits and the whole-run deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent

from orchestrator import (
    CeleryToolMiddleware,
    RunDeadlineExceeded,
    discover_tools,
    dispatcher_for,
    with_deadline,
)
from orchestrator.call import PreparedCall
from orchestrator.dispatch import CeleryDispatcher
from tests.support.fleet import (
    effects,
    one_turn,
    result_state,
    running_calls,
    started_calls,
    wait_until,
)
from tool_workers.builtin.workspace import GREP_MATCH_SECONDS
from tool_workers.contract.broker import create_app
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def direct(tool: str, **args: Any) -> PreparedCall:
    call_id = f"{tool}-{time.monotonic_ns()}"
    return PreparedCall(tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id))


def test_hung_tool_is_stopped_and_its_process_replaced(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a tool that ignores its soft limit, when it hangs, then the hard limit kills
    its pool process, the model gets an error within limit + 2 s, and the worker keeps
    serving from a fresh process."""
    settings = fault_settings()
    worker = start_worker(settings, pool="prefork", concurrency=1)
    dispatcher = dispatcher_for(settings=settings)
    before = dispatcher.wait(direct("whoami"), timeout=30).content

    t0 = time.monotonic()
    hung = dispatcher.wait(direct("hard_hang", seconds=60), timeout=30)
    took = time.monotonic() - t0
    after = dispatcher.wait(direct("whoami"), timeout=30)

    assert hung.status == "error" and "time limit of 2 s" in hung.content
    assert took < 2 + 2
    assert after.status == "success"
    assert after.content != before  # a new pool process
    assert after.worker == worker.hostname


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_run_deadline_revokes_in_flight_calls(
    mode: str,
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
) -> None:
    """Given a run deadline shorter than its calls, when it passes, then the run raises
    RunDeadlineExceeded, its in-flight calls are revoked (terminated on prefork) and none
    of them completes its side effect."""
    settings = fault_settings()
    start_worker(settings, pool="prefork", concurrency=3)
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["slow_effect"], wait=15)
    calls = [("slow_effect", {"seconds": 4, "tag": f"d{i}"}) for i in range(3)]
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    config = with_deadline(1.5, {"configurable": {"thread_id": f"deadline-{mode}"}})
    payload = {"messages": [("user", "go")]}

    t0 = time.monotonic()
    with pytest.raises(RunDeadlineExceeded):
        if mode == "sync":
            agent.invoke(payload, config)
        else:
            asyncio.run(agent.ainvoke(payload, config))
    took = time.monotonic() - t0
    # Every call that started has ended, one way or another: a call that survived its
    # revocation would have recorded its effect by then.
    wait_until(lambda: running_calls(settings) == 0, 30, "the end of every call")

    assert took < 1.5 + 2
    assert effects(counter, settings, "slow_effect") == {}
    assert dispatcher.in_flight() == 0


def test_cancelled_async_run_revokes_its_calls(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any], counter: Any
) -> None:
    """Given an async run with calls in flight, when the caller cancels it, then the calls
    are revoked and terminated: their state is REVOKED and no side effect completes."""
    settings = fault_settings()
    start_worker(settings, pool="prefork", concurrency=3)
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["slow_effect"], wait=15)
    calls = [("slow_effect", {"seconds": 4, "tag": f"x{i}"}) for i in range(3)]
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    dispatched: list[str] = []

    async def run() -> None:
        async for chunk in agent.astream({"messages": [("user", "go")]}, stream_mode="custom"):
            event = chunk.get("toolfleet", {}) if isinstance(chunk, dict) else {}
            if event.get("event") == "dispatched":
                dispatched.append(event["task_id"])

    async def cancel_soon() -> None:
        task = asyncio.ensure_future(run())
        while await asyncio.to_thread(started_calls, settings) < 3:  # every call is running
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_soon())
    wait_until(lambda: running_calls(settings) == 0, 30, "the end of every call")

    assert len(dispatched) == 3
    assert {result_state(settings, t) for t in dispatched} == {"REVOKED"}
    assert effects(counter, settings, "slow_effect") == {}
    assert dispatcher.in_flight() == 0


@pytest.mark.serial  # a CPU-bound call's stop is bounded: the other processes' tests would share it
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_catastrophic_grep_pattern_is_stopped_on_any_pool(
    pool: str, make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given the built-in grep and a pattern that backtracks without end, when called on
    either pool, then it stops after grep's matching budget with an error naming the
    pattern (before, it ran to the hard time limit, and forever on the threads pool), and
    the worker serves the next call."""
    settings = make_settings(tool_modules=())
    settings.workspace_root.mkdir(parents=True, exist_ok=True)
    (settings.workspace_root / "a.txt").write_text("a" * 40 + "!\n")
    start_worker(settings, pool=pool, concurrency=2)
    dispatcher = dispatcher_for(settings=settings)

    t0 = time.monotonic()
    result = dispatcher.wait(direct("grep", pattern=r"(a|aa)+$"), timeout=60)
    took = time.monotonic() - t0
    after = dispatcher.wait(direct("grep", pattern="a+!"), timeout=30)

    assert result.status == "error" and f"took more than {GREP_MATCH_SECONDS:g} s" in (
        result.content
    ), result
    # The regex package counts the budget loosely on a loaded machine; the point is that
    # it stops well before the test policy's 60 s hard limit.
    assert took < 40, took
    assert after.status == "success" and "a.txt:1:" in after.content


def test_call_cancelled_while_no_worker_is_up_never_runs(
    fault_settings: Callable[..., Settings], start_worker: Callable[..., Any], counter: Any
) -> None:
    """Given a non-idempotent call published and then cancelled while no worker is up
    (Celery's revoke broadcast reaches nobody), when a worker starts, then the call never
    runs and a waiter that re-attaches to it (a resumed orchestrator) gets a cancelled
    result."""
    settings = fault_settings()
    first = CeleryDispatcher(create_app(settings), settings, owns_app=True)
    call = direct("charge", amount=5)
    try:
        first.submit([call])
        first.cancel([call])
    finally:
        first.close()

    start_worker(settings, pool="prefork", concurrency=1)
    waiter = dispatcher_for(settings=settings)
    result = waiter.wait(call, timeout=30)
    after = waiter.wait(direct("charge", amount=1), timeout=30)

    assert result.status == "error" and result.error_kind == "cancelled", result
    assert "was not run" in result.content
    assert after.content == "charged 1 (run 1)"
    assert call.task_id not in effects(counter, settings, "charge")
