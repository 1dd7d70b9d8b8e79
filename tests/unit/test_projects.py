"""LangGraph project files: parsing, importing the graphs, and serving them as assistants."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel
from langgraph.store.memory import InMemoryStore

from orchestrator.server.errors import NotFound
from orchestrator.server.graphs import Graphs, ProjectSource, assistant_id_for
from orchestrator.server.projects import GraphSpec, ProjectGraph, import_graph, read_project
from tool_workers.contract.errors import ConfigError

GRAPHS_MODULE = """
from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

MADE: list[dict] = []


class State(TypedDict, total=False):
    n: Annotated[int, operator.add]
    tag: str


def builder(tag: str = "") -> StateGraph:
    graph = StateGraph(State)
    graph.add_node("step", lambda state: {"n": 1, "tag": tag})
    graph.add_edge(START, "step")
    graph.add_edge("step", END)
    return graph


compiled = builder("compiled").compile(checkpointer=InMemorySaver())
uncompiled = builder("uncompiled")


def with_config(config):
    MADE.append(config)
    return builder(config["configurable"].get("tag", "none"))


def without_config():
    return builder("plain").compile()


async def made_async(config):
    return builder("async")


def two_arguments(config, other):
    return builder()


not_a_graph = 42
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "things.py").write_text(GRAPHS_MODULE)
    (tmp_path / "lib" / f"pkg_{tmp_path.name}").mkdir(parents=True)
    (tmp_path / "lib" / f"pkg_{tmp_path.name}" / "__init__.py").write_text(GRAPHS_MODULE)
    (tmp_path / "settings.env").write_text("TF_PROJECT_A=from-file\nTF_PROJECT_B=file\n")
    config = {
        "dependencies": ["./lib", "some-package>=1"],
        "graphs": {
            "compiled": "./graphs/things.py:compiled",
            "uncompiled": "./graphs/things.py:uncompiled",
            "configured": f"pkg_{tmp_path.name}:with_config",
            "plain": {"path": "./graphs/things.py:without_config", "description": "no config"},
            "async": "./graphs/things.py:made_async",
        },
        "env": "settings.env",
        "dockerfile_lines": [],
    }
    (tmp_path / "langgraph.json").write_text(json.dumps(config))
    return tmp_path / "langgraph.json"


def test_given_a_project_file_then_graphs_dependencies_and_env_are_read(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = read_project(project)

    assert [g.graph_id for g in parsed.graphs] == [
        "compiled",
        "uncompiled",
        "configured",
        "plain",
        "async",
    ]
    assert parsed.graphs[3].description == "no config"
    assert parsed.dependencies == (project.parent / "lib",)  # package names are not paths
    assert parsed.env == {"TF_PROJECT_A": "from-file", "TF_PROJECT_B": "file"}
    monkeypatch.setenv("TF_PROJECT_B", "from-the-process")
    monkeypatch.delenv("TF_PROJECT_A", raising=False)
    parsed.apply_env()
    assert os.environ["TF_PROJECT_A"] == "from-file"
    assert os.environ["TF_PROJECT_B"] == "from-the-process"  # the deployment overrides
    monkeypatch.delenv("TF_PROJECT_A")


def test_given_an_env_mapping_then_it_is_the_env(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"g": "m:g"}, "env": {"X": "1"}}))
    assert read_project(path).env == {"X": "1"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a LangGraph project"),
        ('{"dependencies": ["."]}', "not a LangGraph project"),
        ('{"graphs": {}}', "names no graph"),
        ('{"graphs": {"g": "m:g"}, "env": "missing.env"}', "env file"),
    ],
)
def test_given_a_bad_project_file_then_it_is_a_config_error(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_project(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_project(tmp_path / "absent.json")


def test_given_graph_paths_then_files_and_modules_are_imported(project: Path) -> None:
    try:
        loaded = {g.spec.graph_id: g for g in read_project(project).load()}
    finally:
        sys.path.remove(str(project.parent / "lib"))

    assert isinstance(loaded["compiled"].value, Pregel)
    assert isinstance(loaded["uncompiled"].value, Pregel)  # a StateGraph, compiled
    assert loaded["configured"].is_factory and loaded["configured"].takes_config
    assert loaded["plain"].is_factory and not loaded["plain"].takes_config
    assert loaded["async"].is_factory and loaded["async"].takes_config


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("./graphs/things.py:missing", "cannot import"),
        ("./graphs/nothing.py:graph", "cannot import"),
        ("no_such_module_anywhere:graph", "cannot import"),
        ("./graphs/things.py", "is not"),
        ("./graphs/things.py:not_a_graph", "not a graph or a function"),
        ("./graphs/things.py:two_arguments", "more than one argument"),
    ],
)
def test_given_bad_graph_paths_then_they_are_config_errors(
    project: Path, target: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        import_graph(GraphSpec("bad", target), project.parent)


def test_given_project_graphs_then_the_servers_checkpointer_runs_them(project: Path) -> None:
    """A compiled graph's own checkpointer is replaced; a factory is made for each run,
    with the run's config; the assistants carry LangGraph's ids for the graph ids."""
    try:
        loaded = {g.spec.graph_id: g for g in read_project(project).load()}
    finally:
        sys.path.remove(str(project.parent / "lib"))
    ours = InMemorySaver()
    graphs = Graphs([ProjectSource(graph, ours) for graph in loaded.values()])

    async def scenario() -> dict[str, Any]:
        results: dict[str, Any] = {}
        for graph_id in loaded:
            config = {"configurable": {"thread_id": f"t-{graph_id}", "tag": "from-run"}}
            graph = await graphs.get(graph_id).for_run(config)
            assert graph.checkpointer is ours
            await graph.ainvoke({}, config)
            reader = await graphs.for_thread(f"t-{graph_id}", {"graph_id": graph_id})
            results[graph_id] = (await reader.aget_state(config)).values
        return results

    results = asyncio.run(scenario())

    assert results["compiled"] == {"n": 1, "tag": "compiled"}
    assert results["configured"] == {"n": 1, "tag": "from-run"}
    assert results["async"]["tag"] == "async" and results["plain"]["tag"] == "plain"
    made = sys.modules[f"pkg_{project.parent.name}"].MADE
    assert made[0]["configurable"]["tag"] == "from-run"
    assert {a["graph_id"]: a["assistant_id"] for a in graphs.assistants()} == {
        graph_id: str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), graph_id))
        for graph_id in loaded
    }
    assert graphs.find(assistant_id_for("plain")) is graphs.get("plain")
    assert graphs.get("plain").assistant()["description"] == "no config"
    with pytest.raises(NotFound, match="'compiled'"):
        graphs.get("agent")


def test_given_a_store_then_it_replaces_the_graphs_own_else_the_graph_keeps_its_own() -> None:
    from langgraph.graph import StateGraph

    builder: StateGraph[Any] = StateGraph(dict)
    builder.add_node("n", lambda state: {})
    builder.set_entry_point("n")
    theirs, ours = InMemoryStore(), InMemoryStore()
    graph = ProjectGraph(GraphSpec("g", "./g.py:g"), builder.compile(store=theirs))

    async def stores() -> tuple[Any, Any]:
        kept = await ProjectSource(graph, InMemorySaver()).for_run({})
        replaced = await ProjectSource(graph, InMemorySaver(), ours).for_run({})
        return kept.store, replaced.store

    assert asyncio.run(stores()) == (theirs, ours)


def test_given_a_factory_making_no_graph_then_its_run_fails_with_a_config_error() -> None:
    spec = GraphSpec("odd", "./odd.py:make")
    source = ProjectSource(ProjectGraph(spec, lambda: "a string"), InMemorySaver())
    with pytest.raises(ConfigError, match="made a str"):
        asyncio.run(source.for_run({}))


def test_given_the_servers_graph_ids_then_the_builtin_agent_keeps_langgraphs_id() -> None:
    from orchestrator.server.graph import ASSISTANT_ID

    expected = uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "agent")
    assert str(expected) == ASSISTANT_ID


POLICY = '[tools.add]\nqueue = "math"\n'


@pytest.mark.parametrize("named_by", ["beside", "env_file", "mapping"])
def test_the_tool_policy_is_found_next_to_the_project_not_the_shells_folder(
    named_by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a project folder with its policy file, run from another folder that has a
    policy file of its own, when the project's env is applied, then the project's policy
    is the one read: ``config/toolfleet.toml`` beside ``langgraph.json``, or the relative
    ``TOOLFLEET_CONFIG`` its env file or mapping names, relative to that file."""
    from tool_workers.contract.settings import Settings

    project = tmp_path / "project"
    (project / "config").mkdir(parents=True)
    (project / "settings").mkdir()
    elsewhere = tmp_path / "shell"
    (elsewhere / "config").mkdir(parents=True)
    (elsewhere / "config" / "toolfleet.toml").write_text('[tools.add]\nqueue = "wrong"\n')
    manifest: dict[str, Any] = {"graphs": {"g": "./g.py:graph"}}
    if named_by == "beside":
        (project / "config" / "toolfleet.toml").write_text(POLICY)
    elif named_by == "env_file":
        (project / "settings" / "policy.toml").write_text(POLICY)
        (project / "settings" / ".env").write_text("TOOLFLEET_CONFIG=policy.toml\n")
        manifest["env"] = "settings/.env"
    else:
        (project / "settings" / "policy.toml").write_text(POLICY)
        manifest["env"] = {"TOOLFLEET_CONFIG": "settings/policy.toml"}
    (project / "langgraph.json").write_text(json.dumps(manifest))
    monkeypatch.chdir(elsewhere)
    # Recorded, so what apply_env sets is undone after the test.
    monkeypatch.setenv("TOOLFLEET_CONFIG", "")
    monkeypatch.delenv("TOOLFLEET_CONFIG")

    read_project(project / "langgraph.json").apply_env()

    assert Settings().policies().for_tool("add").queue == "math"
