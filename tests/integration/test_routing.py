"""Heterogeneous fleets: every call reaches a worker that serves its tool.

Workers of different kinds share the quick start's queue (``-Q tools``, docs/quickstart.md);
two versions of one tool are live at once during a rolling upgrade; a call that still
reaches a worker that does not serve it (a stale route, a hand-published message) is
handed on.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain_core.messages import HumanMessage, ToolMessage

from orchestrator import dispatcher_for
from orchestrator.agent import build_agent
from orchestrator.call import PreparedCall
from orchestrator.cli.status import collect, kind_of, read_waiting
from orchestrator.tools import RemoteTool
from tests.support.fleet import rounds
from tool_workers.contract.broker import create_app
from tool_workers.contract.models import ToolSpec, WorkerEntry
from tool_workers.contract.names import task_id_for, tool_queue, worker_registry_key
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(240)

BUILTIN = {"TOOLFLEET_TOOL_MODULES": "tool_workers.builtin"}
V2 = {"TOOLFLEET_TOOL_MODULES": "tests.fleet_tools_v2"}


def answers(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def served(settings: Settings, tool: str, versions: int, timeout: float = 30.0) -> None:
    dispatcher = dispatcher_for(settings=settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dispatcher.served_tools(fresh=True)
        if len(dispatcher.served_versions(tool)) >= versions:
            return
        time.sleep(0.2)
    raise AssertionError(f"{tool} not served at {versions} versions")


def test_two_worker_kinds_on_one_queue_answer_every_call(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    broker_settings: dict[str, Any],
) -> None:
    """Given the quick start's two-kinds setup (one worker serving the built-in toolset and one
    serving the project's own tools, both started with ``-Q tools``), when three rounds of
    six ``add`` and six ``echo`` calls run, then all 36 are answered by a worker that
    serves them, and ``toolfleet status`` shows each tool on its own queue and kind."""
    settings = make_settings(**broker_settings)
    start_worker(settings, name="builtins", queues=("tools",), extra_env=BUILTIN)
    start_worker(settings, name="project", queues=("tools",))
    served(settings, "echo", 1)
    served(settings, "add", 1)
    turn = [("add", {"a": i, "b": 100}) for i in range(6)]
    turn += [("echo", {"text": f"hello {i}"}) for i in range(6)]
    agent = build_agent(settings, model=rounds([turn, turn, turn]), tools=None)

    messages = answers(agent.invoke({"messages": [HumanMessage("go")]}))

    assert len(messages) == 36
    assert all(m.status == "success" for m in messages), [m.content for m in messages]
    assert sorted(str(m.content) for m in messages if m.name == "add") == sorted(
        [str(i + 100) for i in range(6)] * 3
    )
    assert sorted(str(m.content) for m in messages if m.name == "echo") == sorted(
        [f"hello {i}" for i in range(6)] * 3
    )

    status = collect(settings, timeout=5.0)
    routes = {r.tool: r for r in status.routes}
    assert routes["add"].queue == tool_queue("add", routes["add"].version)
    assert [kind_of(w) for w in routes["add"].workers] == ["project"]
    assert [kind_of(w) for w in routes["echo"].workers] == ["builtins"]
    # Both kinds consume "tools" and serve different tools: a call that reaches the other
    # kind is handed on, so nothing can go wrong and nothing is said.
    assert status.warnings == []
    kinds = {k.kind: k for k in status.kinds}
    assert routes["add"].queue in kinds["project"].queues
    assert routes["add"].queue not in kinds["builtins"].queues


def test_two_versions_of_a_tool_live_at_once_each_call_runs_on_its_version(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given workers serving ``add`` at two schema versions on one queue (a rolling
    upgrade), when calls are made with each version's schema, and with arguments only the
    new one takes, then each runs on a worker of its version."""
    settings = make_settings()
    start_worker(settings, name="old", queues=("tools",))
    start_worker(settings, name="new", queues=("tools",), extra_env=V2)
    served(settings, "add", 2)
    dispatcher = dispatcher_for(settings=settings)
    versions = dict(dispatcher.served_versions("add"))
    by_args = {tuple(sorted(s.parameters["properties"])): s for s in versions.values()}
    old, new = by_args[("a", "b")], by_args[("a", "b", "c")]
    assert old.queue == tool_queue("add", old.version)
    assert new.queue == tool_queue("add", new.version)

    turn = [("add", {"a": i, "b": 1}) for i in range(8)]
    for spec, expected in ((old, "{}"), (new, "v2:{}")):
        agent = build_agent(settings, model=rounds([turn]), tools=[RemoteTool.from_spec(spec)])
        got = answers(asyncio.run(agent.ainvoke({"messages": [HumanMessage("go")]})))
        assert sorted(str(m.content) for m in got) == sorted(
            expected.format(i + 1) for i in range(8)
        )
    # No tool bound here (a graph's own ToolNode routes it): the version that takes
    # the arguments.
    agent = build_agent(settings, model=rounds([[("add", {"a": 1, "b": 2, "c": 3})]]), tools=[])
    got = answers(agent.invoke({"messages": [HumanMessage("go")]}))
    assert [m.content for m in got] == ["v2:6"]


def test_waiting_calls_are_counted_per_queue_tool_and_worker_kind(
    make_settings: Callable[..., Settings], broker_settings: dict[str, Any]
) -> None:
    """Given a worker kind registered for ``add`` that takes nothing (its entry only),
    when three calls of ``add`` are published, then they wait in the tool queue the
    status names for that kind, and the gauges' reading counts them per queue, per tool
    and per kind."""
    settings = make_settings(**broker_settings)
    spec = ToolSpec(name="add", parameters={"properties": {"a": {}, "b": {}}})
    queue = tool_queue("add", spec.version)
    assert queue is not None
    entry = WorkerEntry(
        worker=f"gpu@{socket.gethostname()}", pid=1, queues=["tools", queue], tools=[spec],
        updated_at=time.time(),
    )  # fmt: skip
    client = redis.Redis.from_url(settings.own_redis_url)
    client.set(worker_registry_key(settings.key_prefix, entry.worker), entry.model_dump_json())
    dispatcher = dispatcher_for(settings=settings)
    dispatcher.served_tools(fresh=True)
    routed = dispatcher.served_versions("add")[spec.version]
    assert routed.queue == queue
    calls = [prepare_call(f"wait-{i}-{time.monotonic_ns()}", routed) for i in range(3)]
    dispatcher.submit(calls)
    app = create_app(settings)
    try:
        waiting = read_waiting(settings, app)
        status = collect(settings, app=app, timeout=0.5)
    finally:
        app.close()
        dispatcher.cancel(calls)
        client.delete(worker_registry_key(settings.key_prefix, entry.worker))
        client.close()

    assert waiting.queues[queue] == 3
    assert waiting.tools["add"] == 3
    assert waiting.kinds["gpu"] == 3
    (kind,) = status.kinds
    assert kind.kind == "gpu" and kind.waiting == 3
    expected = f"{settings.namespace}:{queue}"
    assert expected in kind.keys


def prepare_call(call_id: str, spec: ToolSpec) -> PreparedCall:
    return PreparedCall(
        tool="add", call_id=call_id, args={"a": 1, "b": 2}, task_id=task_id_for(call_id),
        queue=spec.queue, spec=spec,
    )  # fmt: skip


def test_a_call_on_a_worker_that_does_not_serve_it_is_handed_on(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    """Given calls of ``add`` published to the plain queue (a stale route), which two
    kinds of workers consume, when the built-in toolset's worker receives some, then it
    hands each on to the worker that serves ``add`` and every call is answered with its
    result; once no live worker serves ``add``, such a call is answered with an error."""
    settings = make_settings()
    start_worker(settings, name="builtins", queues=("tools",), extra_env=BUILTIN)
    project = start_worker(settings, name="project", queues=("tools",))
    served(settings, "echo", 1)
    served(settings, "add", 1)
    dispatcher = dispatcher_for(settings=settings)

    def stale(i: int) -> PreparedCall:
        call_id = f"stale-{i}-{time.monotonic_ns()}"
        return PreparedCall(
            tool="add", call_id=call_id, args={"a": i, "b": 1}, task_id=task_id_for(call_id),
            queue="tools",
        )  # fmt: skip

    calls = [stale(i) for i in range(12)]
    dispatcher.submit(calls)
    results = [dispatcher.wait(c, timeout=60) for c in calls]

    assert [r.content for r in results] == [str(i + 1) for i in range(12)]
    assert all(r.status == "success" for r in results)
    # The plain queue is consumed by both kinds: some calls reached the built-ins.
    handed = (tmp_path / "worker-0.log").read_text(errors="replace").count("handed call")
    assert handed >= 1

    project.stop(grace=5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "add" in dispatcher.served_tools(fresh=True):
        time.sleep(0.2)
    lost = stale(99)
    result = dispatcher.wait(lost, timeout=60)
    assert result.status == "error"
    assert "no live worker serves" in str(result.content)
