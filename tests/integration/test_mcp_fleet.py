"""The fleet as an MCP server: ``toolfleet mcp`` on stdio.

The ``mcp`` SDK's client and ``langchain-mcp-adapters``' client list and call the shared
test fleet's tools through a real ``toolfleet mcp`` process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from langchain_mcp_adapters.client import MultiServerMCPClient
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import (
    CancelledNotification,
    CancelledNotificationParams,
    ClientNotification,
    TextContent,
)

from orchestrator.local import settings_env
from tests.support.fleet import REPO, call_states, wait_until
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def server_params(settings: Settings) -> StdioServerParameters:
    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(REPO)}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "orchestrator.cli", "mcp"], env=env, cwd=str(REPO)
    )


@asynccontextmanager
async def fleet_session(settings: Settings) -> AsyncIterator[ClientSession]:
    async with (
        stdio_client(server_params(settings)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def texts(result: Any) -> list[str]:
    return [c.text for c in result.content if isinstance(c, TextContent)]


def test_an_mcp_client_lists_and_calls_the_fleets_tools_over_stdio(
    shared_fleet: Settings,
) -> None:
    """Given the shared fleet, when the ``mcp`` client starts ``toolfleet mcp`` and lists
    its tools, then the fleet's tools are there with their schemas; when it calls them,
    then the answers are the workers': text, a failure as ``isError`` (an unknown name
    a JSON-RPC error), and progress
    events as progress notifications."""

    async def scenario() -> None:
        async with fleet_session(shared_fleet) as session:
            listed = {t.name: t for t in (await session.list_tools()).tools}
            assert {"add", "boom", "progress", "hang"} <= set(listed)
            assert set(listed["add"].inputSchema["properties"]) == {"a", "b"}

            added = await session.call_tool("add", {"a": 2, "b": 40})
            assert texts(added) == ["42"] and not added.isError
            failed = await session.call_tool("boom", {"reason": "on purpose"})
            assert failed.isError and "on purpose" in texts(failed)[0]
            with pytest.raises(McpError, match="Unknown tool: no_such_tool"):
                await session.call_tool("no_such_tool", {})

            seen: list[tuple[float, str | None]] = []

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                seen.append((progress, message))

            done = await session.call_tool(
                "progress", {"steps": 3, "delay": 0.05}, progress_callback=on_progress
            )
            assert texts(done) == ["did 3 steps"]
            assert [p for p, _ in seen] == [1, 2, 3]
            assert seen[0][1] is not None and '"step": 1' in seen[0][1]

    asyncio.run(scenario())


def test_a_client_that_cancels_a_call_revokes_it_on_the_workers(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a call of a tool that runs for seconds, when the client cancels the request,
    then the call is revoked on the worker (the tool stops) and the session goes on."""
    settings = make_settings()
    start_worker(settings, pool="prefork", concurrency=1, queues=("tools",))

    async def scenario() -> None:
        async with fleet_session(settings) as session:
            await session.list_tools()  # request 1 (initialize was 0)

            answers: list[str] = []

            async def call() -> None:
                try:
                    await session.call_tool("sleep_for", {"seconds": 30, "label": "mcp-cancel"})
                except McpError as exc:
                    answers.append(exc.error.message)

            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await anyio.sleep(2.0)
                await session.send_notification(
                    ClientNotification(
                        CancelledNotification(
                            method="notifications/cancelled",
                            params=CancelledNotificationParams(requestId=2, reason="user"),
                        )
                    )
                )
                with anyio.fail_after(10):
                    while not answers:
                        await anyio.sleep(0.05)
            assert answers == ["Request cancelled"]
            after = await session.call_tool("add", {"a": 1, "b": 1})
            assert texts(after) == ["2"]

    asyncio.run(scenario())
    states = wait_until(
        lambda: (s := call_states(settings))["REVOKED"] and s,
        timeout=20,
        what="the cancelled call revoked",
    )
    assert states["SUCCESS"] == 1, states  # add; the 30 s sleep never finished


def test_langchains_mcp_client_reads_the_fleets_tools(shared_fleet: Settings) -> None:
    """Given ``toolfleet mcp``, when ``langchain-mcp-adapters`` loads its tools, then they
    are LangChain tools an agent could bind, and calling one runs it on the fleet."""
    params = server_params(shared_fleet)

    async def scenario() -> None:
        client = MultiServerMCPClient(
            {
                "fleet": {
                    "transport": "stdio",
                    "command": params.command,
                    "args": params.args,
                    "env": params.env,
                    "cwd": params.cwd,
                }
            }
        )
        tools = {t.name: t for t in await client.get_tools()}
        assert {"add", "boom"} <= set(tools)
        out = await tools["add"].ainvoke({"a": 20, "b": 22})
        assert "42" in str(out)

    asyncio.run(scenario())
