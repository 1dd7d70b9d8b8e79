"""``toolfleet serve``'s ``/mcp`` beside LangGraph's server's: the ``mcp`` SDK's client and
``langchain-mcp-adapters``' client over streamable HTTP.

Both servers serve one project; the client lists the assistants as tools and runs one on
each, compared. toolfleet's also offers the fleet's tools (calls, progress), under the
service's token auth and per-tenant scoping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph_sdk import get_client
from mcp import ClientSession, McpError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from tests.support.api_pair import ApiPair, api_pair
from tests.support.fleet import call_states, wait_until
from tests.support.serving import prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

TOKEN_A = f"tft-mcp-a-{uuid.uuid4().hex}"
TOKEN_B = f"tft-mcp-b-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (TOKEN_A, TOKEN_B))


@asynccontextmanager
async def mcp_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=120.0)) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def texts(result: Any) -> list[str]:
    return [c.text for c in result.content if isinstance(c, TextContent)]


async def assistants_scenario(url: str, token: str | None, name: str) -> dict[str, Any]:
    """Create an assistant named ``name``, list the assistant tools, and run the ``made``
    graph's through MCP."""
    async with get_client(url=url, api_key=token) as c:
        await c.assistants.create("fleet", name=name)
    tool = name.replace(" ", "_")
    async with mcp_session(url, token) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        made = await session.call_tool("made", {})
        try:  # LangGraph's server: a JSON-RPC error; toolfleet's: an isError result
            unknown = (await session.call_tool("no_such_assistant", {})).isError
        except McpError as exc:
            unknown = "Unknown tool" in exc.error.message
    listed = tools[tool]
    return {
        "tool": {
            "title": listed.title,
            "description": listed.description,
            "annotations": listed.annotations.model_dump() if listed.annotations else None,
            "input": listed.inputSchema.get("properties"),
        },
        "made": (made.isError, texts(made)),
        "unknown": unknown,
    }


def test_assistants_are_mcp_tools_on_both_servers(pair: ApiPair) -> None:
    """Given one project on both servers and an assistant made on each, when the ``mcp``
    client lists ``/mcp``'s tools and calls the ``made`` assistant's, then both offer the
    assistant alike (name, title, description, hints, input with messages as one string)
    and both answer the run's final values alike."""
    name = f"Helper Bot {uuid.uuid4().hex[:6]}"
    ours = run(assistants_scenario(pair.toolfleet.url, TOKEN_A, name))
    theirs = run(assistants_scenario(pair.langgraph.url, None, name))

    assert ours == theirs
    assert ours["tool"]["input"]["messages"]["type"] == "string"
    assert ours["made"][0] is False and "'seen': 'made'" in ours["made"][1][0]
    assert ours["unknown"] is True


def test_the_fleets_tools_on_mcp_are_called_through_the_fleet(pair: ApiPair) -> None:
    """Given toolfleet's ``/mcp``, when the client lists and calls the fleet's tools, then
    they run on the workers, progress comes back as notifications, and a tool's failure
    is ``isError``."""

    async def scenario() -> None:
        async with mcp_session(pair.toolfleet.url, TOKEN_A) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            assert {"add", "boom", "progress"} <= names
            added = await session.call_tool("add", {"a": 40, "b": 2})
            assert texts(added) == ["42"] and not added.isError
            failed = await session.call_tool("boom", {"reason": "on purpose"})
            assert failed.isError and "on purpose" in texts(failed)[0]
            seen: list[float] = []

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                seen.append(progress)

            done = await session.call_tool(
                "progress", {"steps": 3, "delay": 0.05}, progress_callback=on_progress
            )
            assert texts(done) == ["did 3 steps"] and seen == [1, 2, 3]

    run(scenario())


def test_mcp_takes_the_services_tokens_and_scopes_assistants_by_tenant(pair: ApiPair) -> None:
    """Given two tenants' tokens, when tenant A creates an assistant, then A's ``/mcp``
    offers it and B's does not; a request without a token is refused with 401."""

    async def scenario() -> None:
        async with get_client(url=pair.toolfleet.url, api_key=TOKEN_A) as c:
            await c.assistants.create("fleet", name=f"Only A {uuid.uuid4().hex[:6]}")
        async with mcp_session(pair.toolfleet.url, TOKEN_A) as a:
            seen_a = {t.name for t in (await a.list_tools()).tools}
        async with mcp_session(pair.toolfleet.url, TOKEN_B) as b:
            seen_b = {t.name for t in (await b.list_tools()).tools}
        assert any(n.startswith("Only_A_") for n in seen_a)
        assert not any(n.startswith("Only_A_") for n in seen_b)
        assert "add" in seen_b
        async with httpx.AsyncClient() as http:
            refused = await http.post(
                f"{pair.toolfleet.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Accept": "application/json, text/event-stream"},
            )
        assert refused.status_code == 401

    run(scenario())


async def assistants_made(url: str) -> None:
    async with get_client(url=url, api_key=TOKEN_A) as c:
        await c.assistants.create("fleet", name=f"Only A {uuid.uuid4().hex[:6]}")


def test_langchains_mcp_client_calls_the_fleet_over_http(pair: ApiPair) -> None:
    """Given toolfleet's ``/mcp``, when ``langchain-mcp-adapters`` loads its tools, then the
    fleet's tools and the tenant's assistants are LangChain tools, and one runs on the
    fleet."""
    run(assistants_made(pair.toolfleet.url))

    async def scenario() -> None:
        client = MultiServerMCPClient(
            {
                "fleet": {
                    "transport": "streamable_http",
                    "url": f"{pair.toolfleet.url}/mcp",
                    "headers": {"Authorization": f"Bearer {TOKEN_A}"},
                }
            }
        )
        tools = {t.name: t for t in await client.get_tools()}
        assert "add" in tools and any(n.startswith(("Helper_Bot_", "Only_A_")) for n in tools)
        assert "42" in str(await tools["add"].ainvoke({"a": 41, "b": 1}))

    run(scenario())


def test_a_client_that_goes_away_mid_call_has_its_call_revoked(
    pair: ApiPair, prefork_fleet: Settings
) -> None:
    """Given a ``tools/call`` of a tool that runs for 30 s, when the client closes the
    request's connection, then the call is revoked on the workers."""

    async def scenario() -> None:
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "sleep_for", "arguments": {"seconds": 30, "label": "mcp-gone"}},
        }
        headers = {
            "Authorization": f"Bearer {TOKEN_A}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("POST", f"{pair.toolfleet.url}/mcp", json=body, headers=headers) as answer,
        ):
            assert answer.status_code == 200
            await asyncio.sleep(2.0)  # the call is on a worker; then the client leaves

    before = call_states(prefork_fleet)["REVOKED"]
    run(scenario())
    wait_until(
        lambda: call_states(prefork_fleet)["REVOKED"] > before,
        timeout=20,
        what="the abandoned call revoked",
    )
