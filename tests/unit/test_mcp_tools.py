"""MCP servers' settings, their tools' results and annotations, without a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.tools import ToolException
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import ToolPolicies, ToolPolicy
from tool_workers.mcp.connections import Connections
from tool_workers.mcp.servers import read_servers
from tool_workers.mcp.tools import McpTool, converted, hinted_policies


def test_servers_are_read_inline_or_from_a_file_in_the_mcp_servers_form(tmp_path: Path) -> None:
    data = {
        "mcpServers": {
            "git": {"command": "uvx", "args": ["mcp-server-git"], "env": {"A": "1"}},
            "search": {"url": "https://mcp.example.com/mcp", "headers": {"X-Key": "k"}},
        }
    }
    path = tmp_path / "servers.json"
    path.write_text(json.dumps(data))

    for value in (json.dumps(data), str(path), json.dumps(data["mcpServers"])):
        servers = read_servers(value)
        assert servers["git"].transport == "stdio" and servers["git"].args == ("mcp-server-git",)
        assert servers["git"].env == {"A": "1"}
        assert servers["search"].transport == "http"
        assert servers["search"].headers == {"X-Key": "k"}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"a": {}}', "either 'command'"),
        ('{"a": {"command": "x", "url": "http://h"}}', "either 'command'"),
        ('{"a": {"url": "ftp://h"}}', "http(s) URL"),
        ('{"a": {"command": "x", "args": "y"}}', "'args' must be a list"),
        ('{"a b": {"command": "x"}}', "a name is"),
        ("{nope", "not JSON"),
        ("/nowhere/servers.json", "cannot read"),
    ],
)
def test_a_bad_servers_setting_is_refused_naming_the_problem(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        read_servers(value)
    assert says in str(caught.value)


def test_content_blocks_become_langchain_blocks_and_structured_content_the_artifact() -> None:
    result = CallToolResult(
        content=[
            TextContent(type="text", text="hi"),
            ImageContent(type="image", data="AAAA", mimeType="image/png"),
            ResourceLink(
                type="resource_link", name="r", uri="file:///a.txt", mimeType="text/plain"
            ),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="file:///b.txt", text="inside"),
            ),
        ],
        structuredContent={"n": 1},
    )

    blocks, artifact = converted(result)

    assert [b["type"] for b in blocks] == ["text", "image", "file", "text"]
    assert blocks[1]["base64"] == "AAAA" and blocks[2]["url"] == "file:///a.txt"
    assert blocks[3]["text"] == "inside"
    assert artifact == {"structured_content": {"n": 1}}


def test_an_error_result_raises_with_its_blocks() -> None:
    with pytest.raises(ToolException) as caught:
        converted(CallToolResult(content=[TextContent(type="text", text="bad")], isError=True))
    assert caught.value.args[0][0]["text"] == "bad"


def tool(name: str, hints: ToolAnnotations | None) -> McpTool:
    return McpTool(
        name=name,
        description=name,
        args_schema={"type": "object", "properties": {}},
        server="s",
        remote_name=name,
        annotations=hints,
        connections=Connections({}),
    )


def test_annotations_are_the_policys_defaults_where_it_says_nothing() -> None:
    tools = [
        tool("reader", ToolAnnotations(readOnlyHint=True)),
        tool("upsert", ToolAnnotations(readOnlyHint=False, idempotentHint=True)),
        tool("plain", None),
        tool("pinned", None),
    ]
    policies = ToolPolicies(
        defaults=ToolPolicy(retries=2), tools={"pinned": {"idempotent": True, "retries": 1}}
    )

    hinted = hinted_policies(policies, tools)

    assert hinted.for_tool("reader").idempotent and hinted.for_tool("reader").retries == 2
    assert hinted.for_tool("upsert").idempotent
    assert not hinted.for_tool("plain").idempotent and hinted.for_tool("plain").retries == 0
    assert hinted.for_tool("pinned").idempotent and hinted.for_tool("pinned").retries == 1
    said = ToolPolicies(defaults=ToolPolicy(idempotent=True))
    assert hinted_policies(said, tools).for_tool("plain").idempotent
