"""``toolfleet serve --config langgraph.json``: a LangGraph project's own graphs, served.

The project is tests/project: ``fleet`` is a ``create_agent`` graph with
``CeleryToolMiddleware`` from a file path, ``made`` a function (found through the
project's ``dependencies``) making a ``StateGraph`` for each run from the run's config;
its ``env`` file sets a variable both read. One server over a prefork fleet; every call
goes through ``langgraph-sdk``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

from tests.support.fleet import REPO
from tests.support.serving import ServerProcess, prefork_fleet, run, start_server, wait_for_states
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(180)

PROJECT = REPO / "tests" / "project" / "langgraph.json"
NAMESPACE_GRAPH = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")  # langgraph-api's


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    # No TOOLFLEET_MODEL: the project's graphs bring their own models.
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("project-server"),
        "project",
        args=("--config", str(PROJECT)),
        model=None,
    )
    yield process
    process.stop()


def client(server: ServerProcess) -> Any:
    return get_client(url=server.url, api_key=server.settings.api_tokens[0])


def test_each_graph_is_an_assistant_with_langgraphs_stable_id(server: ServerProcess) -> None:
    """Given the project, then its two graphs, and only they, are the assistants, with
    the ids LangGraph's server gives them, found by id and by graph id."""

    async def scenario() -> list[dict[str, Any]]:
        async with client(server) as c:
            found = await c.assistants.search()
            for assistant in found:
                assert await c.assistants.get(assistant["graph_id"]) == assistant
                assert await c.assistants.get(assistant["assistant_id"]) == assistant
            with pytest.raises(NotFoundError):
                await c.assistants.get("agent")  # the built-in agent is not served
            return found

    found = run(scenario())

    assert [(a["graph_id"], a["name"]) for a in found] == [
        ("fleet", "fleet agent"),
        ("made", "made"),
    ]
    for assistant in found:
        assert assistant["assistant_id"] == str(uuid.uuid5(NAMESPACE_GRAPH, assistant["graph_id"]))
    assert found[1]["description"] == "made for each run"


def test_a_create_agent_graph_runs_its_tool_calls_on_the_fleet(server: ServerProcess) -> None:
    """Given the project's create_agent graph with CeleryToolMiddleware, when a run makes
    two tool calls, then both run on the fleet's worker, and the thread's checkpoints are
    in the server's checkpointer (the graph was compiled without one)."""
    calls = [["add", {"a": 2, "b": 3}], ["sleep_for", {"seconds": 0.2, "label": "s"}]]
    text = '{"calls": ' + str(calls).replace("'", '"') + "}"

    async def scenario() -> tuple[str, list[Any], dict[str, Any]]:
        async with client(server) as c:
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
            return thread["thread_id"], parts, await c.threads.get_state(thread["thread_id"])

    thread_id, parts, state = run(scenario())

    events = [p.data["toolfleet"] for p in parts if p.event == "custom"]
    started = [e for e in events if e["event"] == "started"]
    assert sorted(e["tool"] for e in started) == ["add", "sleep_for"]
    assert all(e["worker"].startswith("tf-server-") for e in started)
    messages = state["values"]["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "tool", "ai"]
    assert messages[-1]["content"] == "done: 2 results: 5, s 0.2"
    saved = Path(server.settings.checkpoint_path)
    with SqliteSaver.from_conn_string(str(saved)) as saver:
        # The service keeps a thread's checkpoints under its tenant: <tenant>/<thread id>.
        stored = {c.config["configurable"]["thread_id"] for c in saver.list(None)}
        assert any(key.endswith(f"/{thread_id}") for key in stored), stored


def test_a_graph_factory_is_made_per_run_with_the_runs_config(server: ServerProcess) -> None:
    """Given the project's factory (from a module of its dependencies), when two runs run
    on one thread, then each is made with its run's config, reads the project's env, and
    their state accumulates in the server's checkpointer."""

    async def scenario() -> tuple[Any, Any, dict[str, Any], list[Any]]:
        async with client(server) as c:
            thread = await c.threads.create()
            first = await c.runs.wait(thread["thread_id"], "made", input={})
            second = await c.runs.wait(thread["thread_id"], "made", input={})
            state = await c.threads.get_state(thread["thread_id"])
            history = await c.threads.get_history(thread["thread_id"])
            return first, second, state, history

    first, second, state, history = run(scenario())

    assert first == {"seen": "made", "marker": "from-the-env-file", "runs": 1}
    assert second["runs"] == 2 and state["values"] == second
    assert state["metadata"]["graph_id"] == "made"
    assert len(history) >= 4  # input and one step, per run


def test_cancelling_a_project_graphs_run_revokes_its_tool_tasks(
    server: ServerProcess, prefork_fleet: Settings
) -> None:
    """Given a run of the project's agent whose tool call takes 30 s, when it is cancelled
    once the call started, then the run is interrupted and the Celery task REVOKED: the
    middleware in the user's graph gets the cancellation as in the built-in agent."""
    text = '{"calls": [["sleep_for", {"seconds": 30}]]}'

    async def scenario() -> tuple[str, Any]:
        async with client(server) as c:
            thread = await c.threads.create()
            created = await c.runs.create(
                thread["thread_id"],
                "fleet",
                input={"messages": [{"role": "user", "content": text}]},
                stream_mode="custom",
            )
            async for part in c.runs.join_stream(thread["thread_id"], created["run_id"]):
                if part.event == "custom" and part.data["toolfleet"]["event"] == "started":
                    task_id: str = part.data["toolfleet"]["task_id"]
                    break
            cancelled = await c.runs.cancel(thread["thread_id"], created["run_id"], wait=True)
            return task_id, cancelled

    task_id, cancelled = run(scenario())

    assert cancelled["status"] == "interrupted"
    assert wait_for_states(prefork_fleet, [task_id], "REVOKED") == {task_id: "REVOKED"}
