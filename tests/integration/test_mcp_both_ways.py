"""MCP both ways with the ``mcp`` SDK alone, under whichever major is installed.

``pip install 'toolfleet[server,mcp]'`` resolves the newest ``mcp``; the dev extra's
``langchain-mcp-adapters`` holds it below 2. These tests use only the SDK's own client
(read through :func:`tool_workers.compat.mcp.wire`, the protocol's field names) so that
CI runs them in both: a worker serving an MCP server's tools, ``toolfleet mcp`` on
stdio, and ``toolfleet serve``'s ``/mcp``, with its answers to bad calls.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import INVALID_PARAMS

from orchestrator.agent import build_agent
from orchestrator.local import settings_env
from tests.support.fleet import REPO, rounds
from tests.support.mcp_servers import stdio_entry
from tests.support.serving import ServerProcess, prefork_fleet, run, start_server
from tool_workers.compat.mcp import McpError, error_data, streamable_http, wire
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(180)


def texts(result: Any) -> list[str]:
    return [c["text"] for c in wire(result)["content"] if c.get("type") == "text"]


def test_a_worker_serves_an_mcp_servers_tools(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a worker with the stdio test server in ``TOOLFLEET_MCP_SERVERS``, when the
    fleet calls its ``add``, then the server's answer comes back."""
    servers = {"mcpServers": {"files": stdio_entry()}}
    settings = make_settings(tool_modules=(), mcp_servers=json.dumps(servers))
    start_worker(settings, name="mcp", pool="prefork", concurrency=1, queues=("tools",))
    agent = build_agent(
        settings, model=rounds([[("add", {"a": 40, "b": 2})]]), tools=None, wait_for_tools=20.0
    )
    result = agent.invoke({"messages": [HumanMessage("go")]})
    (answer,) = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "success" and "42" in str(answer.content)
    assert answer.artifact == {"structured_content": {"result": 42}}


def fleet_params(settings: Settings) -> StdioServerParameters:
    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO)}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "orchestrator.cli", "mcp"], env=env, cwd=str(REPO)
    )


def test_toolfleet_mcp_offers_the_fleets_tools_on_stdio(shared_fleet: Settings) -> None:
    """Given ``toolfleet mcp``, when the SDK's client lists and calls its tools, then they
    run on the fleet; an unknown name is a JSON-RPC invalid-params error."""

    async def scenario() -> None:
        async with (
            stdio_client(fleet_params(shared_fleet)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t["name"] for t in wire(await session.list_tools())["tools"]}
            assert {"add", "boom"} <= names
            assert texts(await session.call_tool("add", {"a": 40, "b": 2})) == ["42"]
            with pytest.raises(McpError) as caught:
                await session.call_tool("no_such_tool", {})
            assert error_data(caught.value) == (INVALID_PARAMS, "Unknown tool: no_such_tool")

    run(scenario())


@pytest.fixture(scope="module")
def served(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = start_server(prefork_fleet, tmp_path_factory.mktemp("mcp-both-ways"), "serve")
    yield server
    server.stop()


def token(server: ServerProcess) -> str:
    return server.settings.api_tokens[0]


@asynccontextmanager
async def http_session(server: ServerProcess) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token(server)}"}
    async with (
        streamable_http(f"{server.url}/mcp", headers, timeout=30.0, read=120.0) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_serves_mcp_lists_and_calls_the_fleets_tools(served: ServerProcess) -> None:
    """Given ``toolfleet serve``, when the SDK's client calls ``/mcp``, then the fleet's
    tools are listed and a call runs on a worker."""

    async def scenario() -> None:
        async with http_session(served) as session:
            names = {t["name"] for t in wire(await session.list_tools())["tools"]}
            assert {"add", "boom"} <= names
            added = await session.call_tool("add", {"a": 40, "b": 2})
            assert texts(added) == ["42"] and not wire(added).get("isError")

    run(scenario())


def test_an_unknown_tool_on_mcp_is_a_json_rpc_error(served: ServerProcess) -> None:
    """Given ``/mcp``, when a client calls a name that is neither a fleet tool nor an
    assistant, then the answer is a JSON-RPC invalid-params error (as LangGraph's)."""

    async def scenario() -> None:
        async with http_session(served) as session:
            with pytest.raises(McpError) as caught:
                await session.call_tool("no_such_assistant", {})
            assert error_data(caught.value) == (INVALID_PARAMS, "Unknown tool: no_such_assistant")

    run(scenario())


def post(server: ServerProcess, body: str) -> httpx.Response:
    """One raw JSON-RPC POST to ``/mcp`` (a stateless server needs no ``initialize``)."""
    return httpx.post(
        f"{server.url}/mcp",
        content=body.encode(),
        headers={
            "Authorization": f"Bearer {token(server)}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
        timeout=60.0,
    )


def test_a_lone_surrogate_in_arguments_is_invalid_params(served: ServerProcess) -> None:
    """Given ``/mcp``, when a call's arguments hold a lone surrogate (JSON's ``\\ud800``,
    which no client library encodes, so it is sent raw), then it is refused with a 400
    and a JSON-RPC invalid-params error naming where, never run."""
    call = '{"name": "add", "arguments": {"a": 1, "b": 2, "note": "\\ud800"}}'
    answer = post(
        served, '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ' + call + "}"
    )
    assert answer.status_code == 400, answer.text[:500]
    reply = answer.json()
    assert reply["id"] == 7 and reply["error"]["code"] == INVALID_PARAMS, reply
    assert "string at params.arguments.note holds a lone surrogate" in reply["error"]["message"]


def test_a_body_nested_too_deep_is_a_4xx_that_says_so(served: ServerProcess) -> None:
    """Given ``/mcp``, when a body is nested 100,000 deep, then the answer is a 4xx that
    says so, not a 500."""
    depth = 100_000
    body = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + "[" * depth
    body += "]" * depth + "}"
    answer = post(served, body)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:300])
    assert "nested too deeply" in answer.json()["error"]["message"]


def test_mcp_models_are_read_in_the_protocols_names(tmp_path: Path) -> None:
    """The compat module's reading of SDK models: camelCase under every major."""
    from mcp.types import CallToolResult, TextContent

    result = CallToolResult(
        content=[TextContent(type="text", text="x")], structuredContent={"n": 1}, isError=True
    )
    fields = wire(result)
    assert fields["isError"] is True and fields["structuredContent"] == {"n": 1}
