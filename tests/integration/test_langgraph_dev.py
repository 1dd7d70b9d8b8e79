"""The project's CeleryToolMiddleware graph inside LangGraph's own server (``langgraph dev``,
default settings), driven by ``langgraph-sdk``: its tool calls run on the fleet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client

from tests.support.fleet import REPO
from tests.support.langgraph_dev import start_langgraph_dev
from tests.support.serving import ServerProcess, prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

PROJECT = REPO / "tests" / "project" / "langgraph.json"


@pytest.fixture(scope="module")
def langgraph_dev(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = start_langgraph_dev(prefork_fleet, PROJECT, tmp_path_factory.mktemp("lg-dev"))
    yield server
    server.stop()


def test_a_run_with_tool_calls_runs_them_on_the_fleet(langgraph_dev: ServerProcess) -> None:
    """Given langgraph dev serving the project, when a run of its create_agent graph makes
    two tool calls, then both run on the fleet's worker and the run succeeds."""
    text = json.dumps({"calls": [["add", {"a": 2, "b": 3}], ["sleep_for", {"seconds": 0.2}]]})

    async def scenario() -> tuple[list[Any], dict[str, Any]]:
        async with get_client(url=langgraph_dev.url) as c:
            thread = await c.threads.create()
            parts = [
                part
                async for part in c.runs.stream(
                    thread["thread_id"],
                    "fleet",
                    input={"messages": [{"role": "user", "content": text}]},
                    stream_mode=["values", "custom"],
                )
            ]
            return parts, await c.threads.get_state(thread["thread_id"])

    parts, state = run(scenario())

    errors = [p.data for p in parts if p.event == "error"]
    assert not errors, f"{errors}\n--- langgraph dev:\n{langgraph_dev.log()[-6000:]}"
    started = [
        p.data["toolfleet"]
        for p in parts
        if p.event == "custom" and p.data["toolfleet"]["event"] == "started"
    ]
    assert sorted(e["tool"] for e in started) == ["add", "sleep_for"]
    assert all(e["worker"].startswith("tf-server-") for e in started)
    assert state["values"]["messages"][-1]["content"].startswith("done: 2 results: 5, ")
