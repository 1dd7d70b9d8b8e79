"""What an assistant's graph looks like: its drawable graph, its JSON schemas, its
subgraphs (what LangGraph Studio and ``RemoteGraph.get_graph`` read).

The shapes are LangGraph's server's: the graph is ``DrawableGraph.to_json()`` without the
nodes' Python ids; the schemas are the graph's input, output and context JSON schemas,
its state (one property per channel a client streams, typed by what the channel takes)
and the ``configurable`` part of its config schema (``{}`` if none), without the keys
the runtime sets itself. A schema the graph cannot give is ``null``, as there.
"""

from __future__ import annotations

import logging
import warnings
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import TypeAdapter, create_model

from orchestrator.server.errors import Unsupported
from orchestrator.server.openapi import NOT_FOUND
from orchestrator.server.schemas import ID_MAX_CHARS, ItemId
from orchestrator.server.services import Svc, Tenant, json_response

log = logging.getLogger("toolfleet.server")

router = APIRouter(prefix="/assistants", tags=["assistants"])

RUNTIME_KEYS = ("__pregel_checkpointer", "__pregel_store", "checkpoint_id", "checkpoint_ns")
"""``configurable`` keys the runtime fills in: not for a client to set."""

XRAY = r"^(true|false|True|False|[1-9][0-9]{0,2})$"
"""``xray``: a boolean, or how many levels of subgraphs to draw (1-999)."""


@router.get("/{assistant_id}/graph", responses=NOT_FOUND)
async def get_graph(
    svc: Svc,
    tenant: Tenant,
    assistant_id: ItemId,
    xray: Annotated[str, Query(pattern=XRAY)] = "false",
) -> Response:
    """The assistant's graph as nodes and edges (with ``xray``, its subgraphs' too)."""
    depth: bool | int = xray in ("true", "True") or (int(xray) if xray.isdigit() else False)
    graph = await _graph(svc, tenant, assistant_id)
    try:
        drawn = (await graph.aget_graph(xray=depth)).to_json()
    except NotImplementedError:
        raise Unsupported("the graph cannot be drawn") from None
    for node in drawn.get("nodes", []):
        if isinstance(node.get("data"), dict):
            node["data"].pop("id", None)  # a Python object path of this process
    return json_response(drawn)


@router.get("/{assistant_id}/schemas", responses=NOT_FOUND)
async def get_schemas(svc: Svc, tenant: Tenant, assistant_id: ItemId) -> Response:
    """The JSON schemas of the assistant's input, output, state, config and context."""
    source, _ = await svc.assistants.resolve(tenant, assistant_id)
    graph = await _graph(svc, tenant, assistant_id)
    return json_response({"graph_id": source.graph_id, **graph_schemas(graph)})


@router.get("/{assistant_id}/subgraphs", responses=NOT_FOUND)
async def get_subgraphs(
    svc: Svc, tenant: Tenant, assistant_id: ItemId, recurse: bool = False
) -> Response:
    """The schemas of the assistant's subgraphs, by namespace."""
    return await _subgraphs(svc, tenant, assistant_id, None, recurse)


@router.get("/{assistant_id}/subgraphs/{namespace}", responses=NOT_FOUND)
async def get_subgraphs_in(
    svc: Svc,
    tenant: Tenant,
    assistant_id: ItemId,
    namespace: Annotated[str, Path(min_length=1, max_length=ID_MAX_CHARS)],
    recurse: bool = False,
) -> Response:
    """The schemas of the subgraphs in one namespace of the assistant's graph."""
    return await _subgraphs(svc, tenant, assistant_id, namespace, recurse)


def graph_schemas(graph: Any) -> dict[str, Any]:
    """The five schemas of ``graph`` (``None`` for one it cannot give)."""
    makers = {
        "input_schema": graph.get_input_jsonschema,
        "output_schema": graph.get_output_jsonschema,
        "state_schema": lambda: _state_schema(graph),
        "config_schema": lambda: _configurable_schema(graph),
        "context_schema": graph.get_context_jsonschema,
    }
    schemas: dict[str, Any] = {}
    for name, make in makers.items():
        try:
            schemas[name] = make()
        except Exception as exc:  # a graph's types may have no JSON schema: say null
            log.warning("graph %s: no %s (%s: %s)", graph.name, name, type(exc).__name__, exc)
            schemas[name] = None
    return schemas


async def _graph(svc: Svc, tenant: str, assistant_id: str) -> Any:
    source, assistant = await svc.assistants.resolve(tenant, assistant_id)
    return await source.for_run(dict(assistant["config"]))


async def _subgraphs(
    svc: Svc, tenant: str, assistant_id: str, namespace: str | None, recurse: bool
) -> Response:
    graph = await _graph(svc, tenant, assistant_id)
    found = {
        ns: graph_schemas(subgraph)
        async for ns, subgraph in graph.aget_subgraphs(namespace=namespace, recurse=recurse)
    }
    return json_response(found)


def _state_schema(graph: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in graph.stream_channels_list:
        kind = graph.channels[name].UpdateType
        try:
            TypeAdapter(kind).json_schema()
        except Exception:  # not expressible in JSON schema: any value
            kind = Any
        fields[name] = (kind, None)
    model: Any = create_model(graph.get_name("State"), **fields)
    schema: dict[str, Any] = model.model_json_schema()
    return schema


def _configurable_schema(graph: Any) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # config_schema: kept for this
        config = graph.config_schema()
    fields = getattr(config, "model_fields", {})
    if "configurable" not in fields:
        return {}  # nothing to configure (LangGraph's server answers the same)
    annotation: Any = fields["configurable"].annotation
    schema: dict[str, Any] = TypeAdapter(annotation).json_schema()
    for key in RUNTIME_KEYS:
        schema.get("properties", {}).pop(key, None)
    return schema
