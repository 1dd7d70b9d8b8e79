"""MCP servers' tools as LangChain tools a worker serves like its own.

Each tool an MCP server lists becomes an :class:`McpTool`: its name, description and
input schema are the server's, and a call goes to the server through this process's
session (:mod:`tool_workers.mcp.connections`). Content blocks come back as LangChain
content blocks (text, images, audio, files; an embedded text resource as text), the
structured content as the artifact; an ``isError`` result, a JSON-RPC error or a server
that exits are error ToolMessages. MCP progress notifications go to the call's stream
writer, and so to the orchestrator as progress events.

Two servers offering one name: each is served as ``<server>_<name>``, with a warning.
The tool's annotations are its policy's defaults where the policy file says nothing
(:func:`hinted_policies`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from billiard.exceptions import SoftTimeLimitExceeded
from langchain_core.messages.content import (
    create_audio_block,
    create_file_block,
    create_image_block,
    create_text_block,
)
from langchain_core.tools import BaseTool, ToolException
from mcp.types import CallToolResult, ContentBlock, Tool, ToolAnnotations
from pydantic import ConfigDict, Field

from tool_workers.compat.mcp import McpError, error_data, wire
from tool_workers.contract.errors import ToolLoadError
from tool_workers.contract.settings import Settings, ToolPolicies
from tool_workers.mcp.connections import Connections, ServerExited, list_tools
from tool_workers.mcp.servers import ServerConfig, read_servers

log = logging.getLogger("toolfleet.mcp")


class McpTool(BaseTool):
    """One tool of an MCP server, called through this process's session with it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    server: str
    """The server's name in ``TOOLFLEET_MCP_SERVERS``."""
    remote_name: str
    """The tool's name on its server (the served name may carry the server's prefix)."""
    annotations: ToolAnnotations | None = None
    connections: Connections = Field(exclude=True)
    timeout: float | None = None
    """Seconds a call may take (the policy's soft time limit): then it is stopped."""
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: bool = True

    def _run(self, **kwargs: Any) -> tuple[Any, Any]:
        write = _stream_writer()

        def progress(value: float, total: float | None, message: str | None) -> None:
            event: dict[str, Any] = {"progress": value, "total": total, "server": self.server}
            if message:
                event["message"] = message
            write(event)

        try:
            result = self.connections.call(
                self.server,
                self.remote_name,
                kwargs,
                timeout=self.timeout,
                progress=progress if write is not _discard else None,
            )
        except TimeoutError as exc:
            # The call's time limit: the same answer as a tool the pool stopped.
            raise SoftTimeLimitExceeded(str(exc)) from exc
        except ServerExited as exc:
            raise ToolException(f"Error: {exc}; it was restarted.") from exc
        except McpError as exc:
            raise ToolException(
                f"Error: MCP server {self.server!r} refused the call to {self.remote_name!r}: "
                f"{error_data(exc)[1]}"
            ) from exc
        return converted(result)


def converted(result: CallToolResult) -> tuple[list[dict[str, Any]], Any]:
    """A call's result as LangChain content blocks and artifact (structured content).

    Raises:
        ToolException: the result is an error (``isError``); its blocks are the message.
    """
    blocks = [dict(block_of(item)) for item in result.content]
    fields = wire(result)
    if fields.get("isError"):
        raise ToolException(blocks or "Error: the MCP tool failed")
    structured = fields.get("structuredContent")
    artifact = {"structured_content": structured} if structured is not None else None
    return blocks, artifact


def block_of(item: ContentBlock) -> Mapping[str, Any]:
    """One MCP content block as a LangChain content block (read in the protocol's own
    field names, the same under every SDK major)."""
    fields = wire(item)
    kind = fields.get("type")
    mime = fields.get("mimeType") or None
    if kind == "text":
        return create_text_block(fields["text"])
    if kind == "image":
        return create_image_block(base64=fields["data"], mime_type=mime)
    if kind == "audio":
        return create_audio_block(base64=fields["data"], mime_type=mime)
    if kind == "resource_link":
        if mime and mime.startswith("image/"):
            return create_image_block(url=str(fields["uri"]), mime_type=mime)
        return create_file_block(url=str(fields["uri"]), mime_type=mime)
    resource = fields.get("resource")
    if kind == "resource" and isinstance(resource, dict):
        if isinstance(resource.get("text"), str):
            return create_text_block(resource["text"])
        if isinstance(resource.get("blob"), str):
            mime = resource.get("mimeType") or None
            if mime and mime.startswith("image/"):
                return create_image_block(base64=resource["blob"], mime_type=mime)
            return create_file_block(base64=resource["blob"], mime_type=mime)
    return create_text_block(item.model_dump_json(by_alias=True, exclude_none=True))


def _discard(_: Any) -> None:
    pass


def _stream_writer() -> Any:
    """The running call's stream writer (a no-op outside a graph's config)."""
    from langgraph.config import get_stream_writer

    try:
        return get_stream_writer()
    except (RuntimeError, KeyError):  # no config, or one of no graph (older langgraph)
        return _discard


def mcp_tools(settings: Settings, policies: ToolPolicies) -> list[BaseTool]:
    """The tools of the servers in ``settings.mcp_servers`` (none when it is unset).

    Each server is started once here to list its tools, and stopped again: the processes
    that run calls start their own sessions (:mod:`tool_workers.mcp.lifecycle`).

    Raises:
        ToolLoadError: the setting is invalid, or a server did not start or list its tools.
    """
    if not settings.mcp_servers:
        return []
    from tool_workers.contract.errors import ConfigError

    try:
        servers = read_servers(settings.mcp_servers)
    except ConfigError as exc:
        raise ToolLoadError(str(exc)) from exc
    listed = {name: _listed(config) for name, config in servers.items()}
    connections = Connections(servers)
    from tool_workers.mcp import lifecycle

    lifecycle.manage(connections)
    counts = Counter(tool.name for tools in listed.values() for tool in tools)
    made: list[BaseTool] = []
    for server, tools in listed.items():
        for tool in tools:
            name = tool.name
            if counts[name] > 1:
                name = f"{server}_{tool.name}"
                log.warning(
                    "MCP tool %r is offered by several servers; %s's is served as %r",
                    tool.name,
                    server,
                    name,
                )
            made.append(_tool(name, server, tool, connections, policies))
    return made


def _listed(config: ServerConfig) -> list[Tool]:
    try:
        return asyncio.run(list_tools(config))
    except Exception as exc:
        raise ToolLoadError(
            f"MCP server {config.name!r} (TOOLFLEET_MCP_SERVERS) did not list its tools: {exc!r}"
        ) from exc


def _tool(
    name: str, server: str, tool: Tool, connections: Connections, policies: ToolPolicies
) -> McpTool:
    fields = wire(tool)
    schema = dict(fields.get("inputSchema") or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return McpTool(
        name=name,
        description=fields.get("description") or fields.get("title") or name,
        args_schema=schema,
        server=server,
        remote_name=tool.name,
        annotations=tool.annotations,
        connections=connections,
        timeout=policies.for_tool(name).effective_soft_limit,
    )


def hinted_policies(policies: ToolPolicies, tools: Iterable[BaseTool]) -> ToolPolicies:
    """``policies`` with MCP tools' annotations as defaults where the file says nothing.

    A tool is idempotent when its server says it is read-only or idempotent (MCP's
    defaults: neither); one that is destructive and not idempotent is never retried.
    A policy file's own ``idempotent`` (under the tool or ``[defaults]``) and a tool's own
    ``retries`` win.
    """
    overrides = {name: dict(values) for name, values in policies.tools.items()}
    for tool in tools:
        if not isinstance(tool, McpTool):
            continue
        hints = wire(tool.annotations) if tool.annotations is not None else {}
        read_only = bool(hints.get("readOnlyHint"))
        idempotent = read_only or bool(hints.get("idempotentHint"))
        destructive = not read_only and hints.get("destructiveHint") is not False
        own = overrides.setdefault(tool.name, {})
        if "idempotent" not in own and "idempotent" not in policies.defaults.model_fields_set:
            own["idempotent"] = idempotent
        if destructive and not idempotent and "retries" not in own:
            own["retries"] = 0
        if not own:
            del overrides[tool.name]
    return policies.model_copy(update={"tools": overrides})
