"""A remote call's ToolMessage as an MCP client reads it."""

from __future__ import annotations

from langchain_core.messages import ToolMessage
from mcp.types import ImageContent, ResourceLink, TextContent

from orchestrator.mcp.results import call_result
from tool_workers.compat.mcp import wire


def test_text_blocks_and_structured_content_cross_as_mcp_content() -> None:
    message = ToolMessage(
        content=[
            {"type": "text", "text": "a pixel"},
            {"type": "image", "base64": "AAAA", "mime_type": "image/png"},
            {"type": "file", "url": "https://example.com/report.pdf"},
        ],
        artifact={"structured_content": {"n": 1}},
        tool_call_id="c1",
    )

    result = call_result(message)

    first, image, link = result.content
    assert isinstance(first, TextContent) and first.text == "a pixel"
    assert isinstance(image, ImageContent) and wire(image)["mimeType"] == "image/png"
    assert isinstance(link, ResourceLink) and link.name == "report.pdf"
    fields = wire(result)  # the protocol's names, under every mcp major
    assert fields["structuredContent"] == {"n": 1} and not fields.get("isError")


def test_an_error_tool_message_is_an_error_result() -> None:
    result = call_result(ToolMessage(content="Error: no", status="error", tool_call_id="c1"))
    assert wire(result)["isError"]
    assert isinstance(result.content[0], TextContent) and result.content[0].text == "Error: no"
