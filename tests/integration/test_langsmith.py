"""LangSmith across the wire: a remote tool's runs join the agent's trace, under its run.

Tracing is configured on each side only by the standard ``LANGSMITH_*`` environment,
pointed at a loopback stand-in for the LangSmith API (tests/support/langsmith_api.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.tracers.langchain import wait_for_all_tracers
from langsmith import run_trees
from langsmith import utils as ls_utils

from orchestrator import CeleryToolMiddleware, dispatcher_for
from tests import langsmith_tools
from tests.support.fleet import one_turn, wait_until
from tests.support.langsmith_api import RecordedRuns, langsmith_api

pytestmark = pytest.mark.timeout(120)

PROJECT = "toolfleet-tests"


def _reset_langsmith() -> None:
    """Make the langsmith package read the environment again (it caches it)."""
    ls_utils.get_env_var.cache_clear()
    ls_utils.get_tracer_project.cache_clear()
    run_trees._CLIENT = None


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, str], RecordedRuns]]:
    """LangSmith tracing on in this process, to the stand-in; the same env for workers."""
    with langsmith_api() as (url, recorded):
        env = {
            "LANGSMITH_TRACING": "true",
            "LANGSMITH_ENDPOINT": url,
            "LANGSMITH_API_KEY": "dummy-key",
            "LANGSMITH_PROJECT": PROJECT,
            "LANGSMITH_DISABLE_RUN_COMPRESSION": "true",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        _reset_langsmith()
        try:
            yield env, recorded
        finally:
            wait_for_all_tracers()
            for name in env:
                monkeypatch.delenv(name)
            _reset_langsmith()


def _finished(recorded: RecordedRuns, name: str, count: int) -> list[dict[str, Any]] | None:
    runs = [r for r in recorded.runs() if r.get("name") == name and r.get("end_time")]
    return runs if len(runs) >= count else None


@pytest.mark.parametrize(
    ("mode", "tool", "step"),
    [
        ("sync", langsmith_tools.traced_lookup, "lookup_step"),
        ("async", langsmith_tools.atraced_lookup, "alookup_step"),
    ],
)
def test_what_a_remote_tool_traces_nests_under_its_tool_run_in_the_agents_trace(
    traced: tuple[dict[str, str], RecordedRuns],
    make_settings: Any,
    start_worker: Any,
    mode: str,
    tool: Any,
    step: str,
) -> None:
    """Given LangSmith tracing on in the orchestrator and on a prefork worker (only the
    LANGSMITH_* environment), when an agent fans out two calls of a remote tool that
    traces a step (and, sync, calls a model), then every run of both processes is in
    the agent's one trace, each step and nested model run is a child of its call's
    tool run (posted by the orchestrator), and there is exactly one tool run per call."""
    env, recorded = traced
    settings = make_settings(tool_modules=("tests.fleet_tools", "tests.langsmith_tools"))
    start_worker(settings, extra_env=env)
    dispatcher = dispatcher_for(settings=settings)
    calls = [(tool.name, {"term": "alpha"}), (tool.name, {"term": "beta"})]
    agent = create_agent(
        one_turn(calls), [tool], middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    payload = {"messages": [("user", "go")]}

    state = agent.invoke(payload) if mode == "sync" else asyncio.run(agent.ainvoke(payload))
    wait_for_all_tracers()

    assert state["messages"][-1].content == "done: 2 results"
    steps = wait_until(lambda: _finished(recorded, step, 2), 30, "the worker's step runs")
    tool_runs = wait_until(lambda: _finished(recorded, tool.name, 2), 30, "the tool runs")
    models = (
        wait_until(lambda: _finished(recorded, "nested_model", 2), 30, "the nested model runs")
        if mode == "sync"
        else []
    )
    runs = recorded.runs()
    by_id = {r["id"]: r for r in runs}
    (root,) = [r for r in runs if not r.get("parent_run_id")]
    assert {r["trace_id"] for r in runs} == {root["id"]}
    assert {r.get("session_name") for r in runs} == {PROJECT}

    assert len(tool_runs) == 2 and all(r["run_type"] == "tool" for r in tool_runs)
    assert sorted(recorded.posts) == sorted(set(recorded.posts)), "a run was posted twice"
    for run in steps + models:
        parent = by_id[run["parent_run_id"]]
        assert parent in tool_runs
        assert run["dotted_order"].startswith(parent["dotted_order"] + ".")
    for term in ("alpha", "beta"):
        (parent,) = [r for r in tool_runs if term in json.dumps(r.get("inputs"))]
        (mine,) = [s for s in steps if term in json.dumps(s.get("inputs"))]
        assert mine["parent_run_id"] == parent["id"]
