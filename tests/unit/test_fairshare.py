"""The call gate: per-tenant and total turns, handed out tenant by tenant."""

from __future__ import annotations

import asyncio
import threading

import pytest

from orchestrator.fairshare import TENANT_KEY, CallGate, tenant_of

pytestmark = pytest.mark.timeout(10)


def test_a_tenant_at_its_share_waits_and_another_goes_at_once() -> None:
    async def scenario() -> list[str]:
        gate = CallGate(per_tenant=2, total=10)
        order: list[str] = []
        assert await gate.acquire("a") and await gate.acquire("a")
        third = asyncio.create_task(gate.acquire("a"))
        await asyncio.sleep(0.01)
        assert not third.done()  # A's third call waits
        assert await asyncio.wait_for(gate.acquire("b"), 1)  # B's first does not
        order.append("b")
        gate.release("a")
        assert await asyncio.wait_for(third, 1)
        order.append("a")
        assert gate.in_flight() == {"a": 2, "b": 1}
        return order

    assert asyncio.run(scenario()) == ["b", "a"]


def test_turns_of_the_total_go_round_the_tenants() -> None:
    """Given a total of one turn held, and A's three calls waiting before B's one, when
    turns come free one by one, then B's call is served second, not fourth."""

    async def scenario() -> list[str]:
        gate = CallGate(per_tenant=5, total=1)
        served: list[str] = []
        assert await gate.acquire("x")

        async def call(tenant: str) -> None:
            await gate.acquire(tenant)
            served.append(tenant)

        tasks = [asyncio.create_task(call(t)) for t in ("a", "a", "a", "b")]
        await asyncio.sleep(0.01)
        assert gate.waiting() == {"a": 3, "b": 1}
        held = "x"
        for _ in range(4):
            gate.release(held)
            await asyncio.sleep(0.01)
            held = served[-1]
        await asyncio.gather(*tasks)
        return served

    assert asyncio.run(scenario()) == ["a", "b", "a", "a"]


def test_a_cancelled_or_timed_out_waiter_leaves_no_turn_behind() -> None:
    async def scenario() -> None:
        gate = CallGate(per_tenant=1, total=1)
        assert await gate.acquire("a")
        waiting = asyncio.create_task(gate.acquire("a"))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not await gate.acquire("b", timeout=0.05)
        assert gate.waiting() == {}
        gate.release("a")
        assert gate.in_flight() == {}
        assert await gate.acquire("b", timeout=0.05)

    asyncio.run(scenario())


def test_threads_and_tasks_share_the_turns() -> None:
    gate = CallGate(per_tenant=1, total=4)
    assert gate.acquire_sync("a")
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(gate.acquire_sync("a", timeout=5)))
    thread.start()

    async def free_one() -> None:
        await asyncio.sleep(0.05)
        gate.release("a")

    asyncio.run(free_one())
    thread.join(5)
    assert got == [True]
    assert not gate.acquire_sync("a", timeout=0.05)


def test_the_tenant_comes_from_the_run_config_alone() -> None:
    assert tenant_of({"configurable": {TENANT_KEY: "team-a"}}) == "team-a"
    assert tenant_of({"configurable": {TENANT_KEY: ""}}) is None
    assert tenant_of({"configurable": {TENANT_KEY: 5}}) is None
    assert tenant_of({}) is None


def test_a_client_cannot_name_another_tenant_in_its_run_config() -> None:
    from orchestrator.server.records import RunRecord
    from orchestrator.server.runconfig import run_config
    from orchestrator.server.schemas import RunCreate

    run_id = "00000000-0000-4000-8000-000000000001"
    run = RunRecord(run_id, "t1", "a1", "now", "now", "pending", "replica", tenant="team-a")
    body = RunCreate.model_validate(
        {"assistant_id": "agent", "config": {"configurable": {TENANT_KEY: "team-b"}}}
    )
    assert tenant_of(run_config(run, body, "agent")) == "team-a"
