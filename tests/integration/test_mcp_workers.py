"""Workers serve MCP servers' tools (``TOOLFLEET_MCP_SERVERS``).

Real MCP servers written with the ``mcp`` SDK (tests/support/mcp_server.py), over stdio
and streamable HTTP, behind real ``celery worker`` processes; an agent with the scripted
model calls their tools through the fleet.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from orchestrator import dispatcher_for
from orchestrator.agent import build_agent
from orchestrator.call import PreparedCall
from tests.support.fleet import rounds
from tests.support.mcp_servers import HttpMcpServer, stdio_entry
from tests.support.sandbox import sandbox_python
from tool_workers.contract.models import ToolResult
from tool_workers.contract.names import task_id_for, tool_queue
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)

POLICY = """
[defaults]
time_limit = 60

[tools.hang]
time_limit = 4
soft_time_limit = 2
"""


def texts(message: ToolMessage) -> list[str]:
    content = message.content
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"]


@pytest.fixture
def http_server() -> Iterator[HttpMcpServer]:
    server = HttpMcpServer().start()
    yield server
    server.stop()


@pytest.fixture
def mcp_fleet(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any], tmp_path: Path
) -> Settings:
    """A prefork worker (one process) serving the stdio test server's tools alone."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    servers = {"mcpServers": {"files": stdio_entry()}}
    settings = make_settings(config=policy, tool_modules=(), mcp_servers=json.dumps(servers))
    start_worker(settings, name="mcp", pool="prefork", concurrency=1, queues=("tools",))
    return settings


def run(settings: Settings, calls: Sequence[Sequence[tuple[str, dict[str, Any]]]]) -> Any:
    agent = build_agent(settings, model=rounds(calls), tools=None, wait_for_tools=20.0)
    return agent


def answers(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def test_an_agent_calls_an_mcp_servers_tools_through_the_fleet(mcp_fleet: Settings) -> None:
    """Given a worker serving a stdio MCP server's tools, when the scripted agent calls
    ``add``, a tool that fails, and one returning an image, then each answer is the
    server's: text and image content blocks, the structured content as the artifact, and
    the failure as an error ToolMessage; each tool is routed to its own tool queue, with
    the server's annotations as its idempotency."""
    agent = run(
        mcp_fleet,
        [[("add", {"a": 2, "b": 3}), ("fail", {"reason": "disk on fire"}), ("picture", {})]],
    )

    got = {m.name: m for m in answers(agent.invoke({"messages": [HumanMessage("go")]}))}

    assert texts(got["add"]) == ["5"]
    assert got["add"].status == "success"
    assert got["add"].artifact == {"structured_content": {"result": 5}}
    assert got["fail"].status == "error"
    assert "disk on fire" in " ".join(texts(got["fail"]))
    blocks = got["picture"].content
    assert isinstance(blocks, list)
    assert [b["type"] for b in blocks] == ["text", "image"]
    assert blocks[1]["mime_type"] == "image/png" and blocks[1]["base64"]
    served = dispatcher_for(settings=mcp_fleet).served_tools(fresh=True)
    assert served["add"].queue == tool_queue("add", served["add"].version)
    assert served["add"].options["idempotent"] is True  # readOnlyHint
    assert served["write_note"].options["idempotent"] is False  # destructive, not idempotent
    assert served["slow"].options["idempotent"] is False  # no annotations: MCP's defaults
    assert "read_file" not in served  # MCP servers alone: no built-ins


def test_progress_is_relayed_and_a_crash_or_a_stuck_call_restarts_the_server(
    mcp_fleet: Settings,
) -> None:
    """Given the same worker, when a slow tool reports progress, then each notification
    reaches the run's custom stream tagged with its call; when the server dies mid-call,
    or a call is stuck past its time limit, then the call is an error ToolMessage and the
    next call runs on a new server process."""
    agent = run(
        mcp_fleet,
        [
            [("slow", {"steps": 3, "delay": 0.05})],
            [("server_pid", {})],
            [("crash", {})],
            [("server_pid", {})],
            [("hang", {})],
            [("server_pid", {})],
        ],
    )
    progress: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    for mode, chunk in agent.stream(
        {"messages": [HumanMessage("go")]}, stream_mode=["custom", "values"]
    ):
        if mode == "custom" and isinstance(chunk, dict) and "progress" in chunk:
            progress.append(chunk)
        elif mode == "values":
            final = chunk

    got = answers(final)
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert progress[-1]["total"] == 3 and progress[-1]["message"] == "step 3"
    assert {p["tool_call_id"] for p in progress} == {got[0].tool_call_id}
    assert texts(got[0]) == ["done in 3 steps"]
    pids = [int(texts(m)[0]) for m in got if m.name == "server_pid"]
    crash = next(m for m in got if m.name == "crash")
    hang = next(m for m in got if m.name == "hang")
    assert crash.status == "error" and "exited during the call" in str(crash.content)
    assert hang.status == "error" and "time limit" in str(hang.content).lower()
    assert len(set(pids)) == 3, pids


def test_two_servers_offering_one_name_are_served_under_prefixes(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    http_server: HttpMcpServer,
) -> None:
    """Given a worker serving a stdio server and a streamable HTTP server that offer the
    same tools, when it starts, then each tool is served as ``<server>_<name>`` (with a
    warning), and an agent's calls reach the server each name says."""
    servers = {"mcpServers": {"local": stdio_entry(), "remote": {"url": http_server.url}}}
    settings = make_settings(tool_modules=(), mcp_servers=json.dumps(servers))
    worker = start_worker(settings, name="two", pool="threads", concurrency=4, queues=("tools",))
    agent = run(settings, [[("local_add", {"a": 1, "b": 2}), ("remote_add", {"a": 3, "b": 4})]])

    got = {m.name: m for m in answers(agent.invoke({"messages": [HumanMessage("go")]}))}

    assert texts(got["local_add"]) == ["3"] and texts(got["remote_add"]) == ["7"]
    served = dispatcher_for(settings=settings).served_tools(fresh=True)
    assert "add" not in served and {"local_server_pid", "remote_server_pid"} <= set(served)
    assert "served as 'remote_add'" in worker.log_file.read_text()
    assert http_server.calls() >= 1


def test_a_server_that_does_not_start_stops_the_worker_with_one_line(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given an MCP server whose command fails, when the worker starts, then it exits
    saying which server did not list its tools."""
    servers = {"broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(2)"]}}
    settings = make_settings(tool_modules=(), mcp_servers=json.dumps(servers))
    worker = start_worker(settings, wait=False)
    assert worker.process is not None
    assert worker.process.wait(60) != 0
    assert "MCP server 'broken' (TOOLFLEET_MCP_SERVERS) did not list its tools" in (
        worker.log_file.read_text()
    )


def call_run_python(settings: Settings, code: str) -> ToolResult:
    call_id = f"call-{uuid.uuid4().hex}"
    call = PreparedCall(
        tool="run_python",
        call_id=call_id,
        args={"code": code, "timeout": 20},
        task_id=task_id_for(call_id),
    )
    return dispatcher_for(settings=settings).wait(call, timeout=120)


def test_an_mcp_tool_named_like_a_built_in_never_takes_its_calls(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given an MCP server offering a ``run_python`` of its own, when a worker serving it
    starts, before the built-in's worker and again after it, then it exits each time
    with one line naming the tool and the setting that would allow it, and the built-in
    worker answers all 6 of 6 ``run_python`` calls (before: the first to register took
    them all, with their code)."""
    servers = {"mcpServers": {"lookalike": stdio_entry("impostor")}}
    built_in = make_settings(
        tool_modules=("tool_workers.builtin",), sandbox_python=sandbox_python()
    )
    impostor = make_settings(
        namespace=built_in.namespace, tool_modules=(), mcp_servers=json.dumps(servers)
    )
    line = (
        "toolfleet: this worker does not start: tool name 'run_python' of mcp:lookalike is "
        "a built-in tool's name; rename the tool or list it in "
        "TOOLFLEET_REGISTRY_SHARED_NAMES to let both serve it"
    )

    first = start_worker(impostor, wait=False, queues=("tools",))
    assert first.process is not None and first.process.wait(60) != 0
    assert line in first.log_file.read_text()
    start_worker(built_in, queues=("tools",))
    again = start_worker(impostor, wait=False, queues=("tools",))
    assert again.process is not None and again.process.wait(60) != 0
    assert line in again.log_file.read_text()

    results = [call_run_python(built_in, f"print({n} * 7)") for n in range(6)]

    assert [r.status for r in results] == ["success"] * 6, results
    assert [f"{n * 7}" in r.content for n, r in enumerate(results)] == [True] * 6, results
    assert not any("impostor" in r.content for r in results)
