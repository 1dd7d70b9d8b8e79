"""``toolfleet serve`` shares the workers between tenants by tool calls, not by runs.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of three slots, with
two tenants and the default share of tool calls. Tenant A's one run fans out to twelve
long calls; tenant B's one short call must not wait for the whole fan-out.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client

from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(150)

A, B = (f"tft-{name}-{uuid.uuid4().hex}" for name in ("a", "b"))

FAN_OUT = 12
LONG = 10.0
"""Seconds each call of A's fan-out takes: the fleet's three slots need four rounds."""


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("fairness"),
        "fairness",
        api_tokens=(f"a:{A}", f"b:{B}"),
    )
    yield process
    process.stop()


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    text = json.dumps({"calls": [list(c) for c in calls]})
    return {"messages": [{"role": "user", "content": text}]}


def test_a_fan_out_holds_another_tenants_call_back_by_at_most_one_call(
    server: ServerProcess,
) -> None:
    """Given tenant A's run of twelve 10 s calls holding the fleet's three slots, when
    tenant B runs one 0.1 s call, then B's answer comes within 15 s (one of A's calls
    and some slack; without shares it waits for all four rounds, 40 s); A's calls wait
    for their turn and are not refused."""

    async def scenario() -> tuple[float, dict[str, Any], int]:
        a, b = get_client(url=server.url, api_key=A), get_client(url=server.url, api_key=B)
        thread_a = await a.threads.create()
        fan_out = [("sleep_for", {"seconds": LONG, "label": f"a{i}"}) for i in range(FAN_OUT)]
        run_a = await a.runs.create(thread_a["thread_id"], "agent", input=ask(*fan_out))
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # A's calls hold the workers
                status = await a.runs.get(thread_a["thread_id"], run_a["run_id"])
                if status["status"] == "running":
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)
            thread_b = await b.threads.create()
            t0 = time.monotonic()
            run_b = await b.runs.create(
                thread_b["thread_id"], "agent", input=ask(("sleep_for", {"seconds": 0.1}))
            )
            answer: dict[str, Any] = {}
            try:
                answer = await asyncio.wait_for(
                    b.runs.join(thread_b["thread_id"], run_b["run_id"]), timeout=25
                )
                waited = time.monotonic() - t0
            except TimeoutError:
                waited = float("inf")
            a_running = await a.runs.get(thread_a["thread_id"], run_a["run_id"])
            return waited, answer, int(a_running["status"] == "running")
        finally:
            await a.runs.cancel(thread_a["thread_id"], run_a["run_id"])
            await a.aclose()
            await b.aclose()

    waited, answer, a_still_running = asyncio.run(scenario())
    assert waited < 15, f"B's one call waited {waited:.1f} s behind A's fan-out"
    assert answer["messages"][-1]["content"].startswith("done: 1 results: slept 0.1"), answer
    assert a_still_running, "A's run was answered or refused instead of waiting its turn"


def test_a_fan_out_beyond_the_share_runs_to_its_end(server: ServerProcess) -> None:
    """Given the default share (four calls of a tenant in flight), when a run fans out to
    nine short calls, then all nine are answered: calls beyond the share wait, they are
    never refused."""

    async def scenario() -> dict[str, Any]:
        a = get_client(url=server.url, api_key=A)
        thread = await a.threads.create()
        calls = [("sleep_for", {"seconds": 0.3, "label": f"c{i}"}) for i in range(9)]
        result = await asyncio.wait_for(
            a.runs.wait(thread["thread_id"], "agent", input=ask(*calls)), timeout=60
        )
        await a.aclose()
        assert isinstance(result, dict)
        return result

    result = asyncio.run(scenario())
    final = result["messages"][-1]["content"]
    assert final.startswith("done: 9 results:"), final
    assert all(f"c{i} 0.3" in final for i in range(9)), final
