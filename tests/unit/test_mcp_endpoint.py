"""``/mcp`` without the ``mcp`` extra, and its GET: answers a client can act on."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from orchestrator.server.mcp import McpEndpoint, simplified, tool_name


def call(method: str) -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/mcp", "headers": [], "app": None}
    asyncio.run(McpEndpoint()(scope, receive, send))
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def test_without_the_mcp_extra_mcp_answers_501_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tool_workers.compat.mcp", None)
    status, _, body = call("POST")
    assert status == 501
    assert "pip install 'toolfleet[mcp]'" in json.loads(body)["error"]


def test_get_is_405_as_on_langgraphs_server() -> None:
    status, headers, _ = call("GET")
    assert status == 405 and headers["allow"] == "POST"


def test_assistant_names_and_schemas_are_made_fit_for_mcp() -> None:
    assert tool_name("  My helper bot! v2 ") == "My_helper_bot_v2"
    schema = {
        "$defs": {"HumanMessage": {}, "AIMessage": {}, "Extra": {"type": "object"}},
        "properties": {
            "messages": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/HumanMessage"}]}},
            "topic": {"type": "string"},
        },
    }
    out = simplified(schema)
    assert out["properties"]["messages"]["type"] == "string"
    assert out["properties"]["topic"] == {"type": "string"}
    assert out["$defs"] == {"Extra": {"type": "object"}}
