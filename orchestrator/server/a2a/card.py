"""The A2A agent card of an assistant."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from fastapi import Request

from orchestrator.server.a2a.protocol import INVALID_PARAMS, MODES, RpcError
from orchestrator.server.errors import NotFound
from orchestrator.server.routes.assistant_graphs import graph_schemas
from orchestrator.server.services import Services


async def agent_card(svc: Services, tenant: str, assistant_id: str, request: Request) -> Any:
    """The A2A agent card of the tenant's assistant.

    Raises:
        RpcError: no such assistant.
    """
    assistant, schema = await load_assistant(svc, tenant, assistant_id)
    inputs, outputs = _modes(assistant)
    properties = schema.get("properties") or {}
    name = assistant.get("name") or assistant["graph_id"]
    description = assistant.get("description") or f"{name} assistant"
    base = str(request.base_url).rstrip("/")
    url = f"{base}/a2a/{assistant['assistant_id']}"
    return {
        "name": name,
        "description": description,
        "url": url,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {
            "streaming": True,
            "pushNotifications": False,
            "stateTransitionHistory": False,
        },
        "defaultInputModes": inputs,
        "defaultOutputModes": outputs,
        "skills": [
            {
                "id": f"{assistant['assistant_id']}-main",
                "name": f"{name} Capabilities",
                "description": description,
                "tags": ["assistant", "langgraph"],
                "examples": [],
                "inputModes": inputs,
                "outputModes": outputs,
                "metadata": {
                    "inputSchema": {
                        "required": schema.get("required") or [],
                        "properties": sorted(properties),
                        "supportsA2A": "messages" in properties,
                    }
                },
            }
        ],
        "version": version("toolfleet"),
    }


def _modes(assistant: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The card's input and output media types: ``metadata.a2a.input_modes`` and
    ``output_modes`` of the assistant where given (non-empty lists of strings).

    Raises:
        RpcError: one of them is given and is not such a list (answered 400).
    """
    metadata = assistant.get("metadata") or {}
    a2a = metadata.get("a2a") if isinstance(metadata, dict) else None
    if a2a is None:
        return list(MODES), list(MODES)
    if not isinstance(a2a, dict):
        raise RpcError(INVALID_PARAMS, "Assistant metadata.a2a must be an object.", 400)
    found = []
    for field in ("input_modes", "output_modes"):
        value = a2a.get(field)
        if value is None:
            found.append(list(MODES))
            continue
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(m, str) and m.strip() for m in value)
        ):
            raise RpcError(
                INVALID_PARAMS,
                f"Assistant metadata.a2a.{field} must be a non-empty array of strings.",
                400,
            )
        found.append([m.strip() for m in value])
    return found[0], found[1]


async def load_assistant(
    svc: Services, tenant: str, assistant_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tenant's assistant and its graph's input schema (its state schema if it has
    none, as LangGraph's server reads it; ``{}`` if neither)."""
    try:
        source, assistant = await svc.assistants.resolve(tenant, assistant_id)
    except NotFound:
        raise RpcError(INVALID_PARAMS, f"Assistant '{assistant_id}' not found") from None
    graph = await source.for_run(dict(assistant.get("config") or {}))
    try:  # the input schema alone: the others cost a message's latency for nothing
        schema: dict[str, Any] | None = graph.get_input_jsonschema()
    except Exception:  # a graph's types may have no JSON schema: its state's then
        schema = None
    if not schema:
        schema = graph_schemas(graph).get("state_schema")
    return assistant, schema or {}
