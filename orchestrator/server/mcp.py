"""``/mcp``: the fleet's tools and the tenant's assistants to any MCP client.

Streamable HTTP, stateless (each POST is a session of its own, as LangGraph's server's
``/mcp`` is, so any replica answers any request); a call's progress notifications go back
on its response's event stream. Requests pass the service's guard first: the same tokens,
and the tenant they name.

The tools are the fleet's (:class:`~orchestrator.mcp.fleet.FleetTools`: the same
dispatch as an agent's calls, the tenant's fair share) and then the tenant's assistants,
as LangGraph's server offers them: named after the assistant (spaces as ``_``, other
characters MCP refuses dropped; a name already taken is skipped with a warning), the
graph's input schema with message lists as one string, and a call running the assistant
on a new thread (``POST /runs/wait``), answered with the Python ``repr`` of the final
values, or ``isError`` with the run's error. A name that is neither is a JSON-RPC
invalid-params error (``Unknown tool: ...``), as on LangGraph's server. The assistants
are read through the service's own routes, in-process, with the caller's credentials,
so they are the tenant's alone.

The ``mcp`` package is imported as the app is built: without the ``mcp`` extra, ``/mcp``
answers 501 saying what to install.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from orchestrator.jsonvalue import surrogate_at
from orchestrator.server.guard import replay

log = logging.getLogger("toolfleet.server")

PAGE = 100
"""Assistants read per search request (LangGraph's server lists as many)."""

MAX_ASSISTANTS = 1000
"""Assistants looked through for a call (LangGraph's server's bound)."""

_INVALID = re.compile(r"[^a-zA-Z0-9_\-.]")
_MESSAGE_TYPES = {
    f"{kind}{chunk}"
    for kind in ("AI", "Human", "Chat", "System", "Function", "Tool")
    for chunk in ("Message", "MessageChunk")
}
_SUPPORT_TYPES = {
    "ToolCall",
    "ToolCallChunk",
    "InvalidToolCall",
    "UsageMetadata",
    "InputTokenDetails",
    "OutputTokenDetails",
}
_CREDENTIALS = ("authorization", "x-api-key")
PARSE_ERROR, INVALID_PARAMS = -32700, -32602
"""JSON-RPC's codes (here, where the ``mcp`` package may be missing)."""


def tool_name(assistant_name: str) -> str:
    """An assistant's name as an MCP tool name (``^[a-zA-Z0-9_\\-.]{1,128}$``)."""
    return _INVALID.sub("", re.sub(r"\s+", "_", assistant_name.strip()))[:128]


def simplified(schema: dict[str, Any]) -> dict[str, Any]:
    """An assistant's input schema for a model: a list of messages becomes one string."""
    defs = schema.get("$defs") or {}
    if not set(defs) & _MESSAGE_TYPES:
        return schema
    kept = {k: v for k, v in defs.items() if k not in _MESSAGE_TYPES | _SUPPORT_TYPES}
    out = {k: v for k, v in schema.items() if k != "$defs"}
    if kept:
        out["$defs"] = kept
    properties = dict(out.get("properties") or {})
    for key, prop in properties.items():
        items = prop.get("items") or {} if isinstance(prop, dict) else {}
        refs = [c.get("$ref", "") for c in items.get("oneOf") or items.get("anyOf") or []]
        if prop.get("type") == "array" and any(
            r.removeprefix("#/$defs/") in _MESSAGE_TYPES for r in refs
        ):
            properties[key] = {
                "type": "string",
                "title": prop.get("title", key),
                "description": "The user message to send to the agent.",
            }
    out["properties"] = properties
    return out


class ServiceSource:
    """The tools of ``/mcp``: the fleet's, then the caller's tenant's assistants."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._fleet: Any = None

    def _fleet_tools(self) -> Any:
        if self._fleet is None:
            from orchestrator.mcp.fleet import FleetTools

            self._fleet = FleetTools(self._app.state.services.dispatcher)
        return self._fleet

    def _client(self, request: Any) -> httpx.AsyncClient:
        # The service's own routes, in-process, as the caller: the tenant's assistants.
        headers = {k: v for k, v in request.headers.items() if k.lower() in _CREDENTIALS}
        transport = httpx.ASGITransport(app=self._app)
        return httpx.AsyncClient(transport=transport, base_url="http://mcp", headers=headers)

    async def tools(self, request: Any) -> list[Any]:
        from mcp.types import Tool, ToolAnnotations

        tools: list[Tool] = await self._fleet_tools().tools()
        taken = {t.name for t in tools}
        async with self._client(request) as client:
            for assistant in await self._assistants(client, PAGE):
                name = tool_name(assistant["name"])
                if not name or name in taken:
                    log.warning("/mcp: assistant %r not offered: its name is taken", name)
                    continue
                schemas = await client.get(f"/assistants/{assistant['assistant_id']}/schemas")
                schema = (schemas.json() or {}).get("input_schema") if schemas.is_success else None
                if schema is None:
                    continue
                schema = simplified(dict(schema))
                schema.setdefault("type", "object")
                taken.add(name)
                tools.append(
                    Tool(
                        name=name,
                        title=assistant["name"],
                        description=assistant.get("description")
                        or f"Tool based on the {assistant['name']} assistant",
                        inputSchema=schema,
                        annotations=ToolAnnotations(
                            readOnlyHint=False,
                            destructiveHint=False,
                            idempotentHint=False,
                            openWorldHint=True,
                        ),
                    )
                )
        return tools

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        progress: Callable[[Any], None] | None,
        request: Any,
    ) -> Any:
        from mcp.types import INVALID_PARAMS, CallToolResult

        from orchestrator.mcp.results import error_result, text
        from tool_workers.compat.mcp import error

        fleet = self._fleet_tools()
        if await fleet.has(name):
            tenant = request.scope.get("state", {}).get("tenant")
            return await fleet.call(name, arguments, progress=progress, tenant=tenant)
        async with self._client(request) as client:
            found = [
                a
                for a in await self._assistants(client, MAX_ASSISTANTS)
                if tool_name(a["name"]) == name
            ]
            if len(found) != 1:
                raise error(
                    INVALID_PARAMS,
                    f"Unknown tool: {name}"
                    if not found
                    else "Multiple tools found with the same name.",
                )
            answer = await client.post(
                "/runs/wait",
                json={"assistant_id": found[0]["assistant_id"], "input": arguments},
                timeout=None,
            )
        value = answer.json()
        if isinstance(value, dict) and "__error__" in value:
            return error_result(str(value["__error__"].get("error") or value["__error__"]))
        if not answer.is_success:
            return error_result(f"Error: {value}")
        return CallToolResult(content=[text(repr(value))])

    async def _assistants(self, client: httpx.AsyncClient, limit: int) -> list[dict[str, Any]]:
        found = await client.post("/assistants/search", json={"limit": limit, "offset": 0})
        found.raise_for_status()
        return list(found.json())


class McpEndpoint:
    """The ASGI endpoint of ``/mcp``: one stateless MCP session per request."""

    def __init__(self) -> None:
        self._server: Any = None
        # Imported as the app is built, not in the event loop at the first request (an
        # import reads files: a blocking call there).
        try:
            from orchestrator.mcp.server import build_server
            from tool_workers.compat.mcp import stateless_http
        except ImportError as exc:
            self._missing: str | None = (
                f"/mcp needs the mcp extra: pip install 'toolfleet[mcp]' ({exc})"
            )
        else:
            self._missing = None
            self._build_server = build_server
            self._stateless_http = stateless_http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "GET":  # no server-initiated stream (as LangGraph's server)
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        if self._missing is not None:
            await JSONResponse({"error": self._missing}, status_code=501)(scope, receive, send)
            return
        if scope["method"] == "POST":
            body = await _body(receive)
            refused = _refusal(body)
            if refused is not None:
                await refused(scope, receive, send)
                return
            receive = replay(body, receive)
        if self._server is None:
            self._server = self._build_server(ServiceSource(scope["app"]))
        manager = self._stateless_http(self._server)
        async with manager.run():
            await manager.handle_request(scope, receive, send)


async def _body(receive: Receive) -> bytes:
    # The service's guard has bounded the body's size already.
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _refusal(body: bytes) -> Response | None:
    """A 400 for a body nested past what a JSON parser takes (which the SDK's transport
    would answer with a 500), or holding a lone surrogate (JSON's ``"\\ud800"``, which
    no encoder downstream writes; the SDKs disagree on it), the same under every ``mcp``
    major; anything else is the transport's to judge."""
    try:
        message = json.loads(body)
    except RecursionError:
        return _rpc_error(None, PARSE_ERROR, "Parse error: JSON nested too deeply")
    except ValueError:
        return None
    where = surrogate_at(message)
    if where is None:
        return None
    rpc_id = message.get("id") if isinstance(message, dict) else None
    if not isinstance(rpc_id, str | int) or isinstance(rpc_id, bool):
        rpc_id = None
    text = f"Invalid params: string at {where} holds a lone surrogate (not encodable as UTF-8)"
    return _rpc_error(rpc_id, INVALID_PARAMS, text)


def _rpc_error(rpc_id: str | int | None, code: int, message: str) -> Response:
    error = {"code": code, "message": message}
    return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error}, status_code=400)


def install(app: FastAPI) -> None:
    """Add ``/mcp`` to the service's routes."""
    app.router.routes.append(Route("/mcp", McpEndpoint(), methods=["GET", "POST", "DELETE"]))
