"""Finding assistants: the server's own (one per graph it runs: the built-in ``agent``, or
a project's) and the tenant's (:mod:`orchestrator.server.assistant_store`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from orchestrator.server.openapi import NOT_FOUND
from orchestrator.server.responses import SELECTED_ASSISTANTS, Assistant
from orchestrator.server.schemas import AssistantCount, AssistantSearch, ItemId
from orchestrator.server.selection import picked
from orchestrator.server.services import Services, Svc, Tenant, json_response

router = APIRouter(prefix="/assistants", tags=["assistants"])


@router.post("/search", response_model=SELECTED_ASSISTANTS)
async def search_assistants(svc: Svc, tenant: Tenant, body: AssistantSearch) -> Response:
    """Assistants matching the graph id, name and metadata given, in the order asked for."""
    found = await _matching(svc, tenant, body)
    field = body.sort_by or "created_at"

    def key(assistant: dict[str, Any]) -> str:
        value = str(assistant.get(field) or "")
        return value.lower() if field in ("name", "graph_id") else value

    # A stable sort: ties (the graphs' assistants share their creation time) keep the
    # project's order, as on LangGraph's server.
    found.sort(key=key, reverse=body.sort_order != "asc")
    page = found[body.offset : body.offset + body.limit]
    return json_response([picked(a, body.select) for a in page])


@router.post("/count", response_model=int)
async def count_assistants(svc: Svc, tenant: Tenant, body: AssistantCount) -> Response:
    """How many assistants match the graph id, name and metadata given."""
    return json_response(len(await _matching(svc, tenant, body)))


@router.get("/{assistant_id}", response_model=Assistant, responses=NOT_FOUND)
async def get_assistant(svc: Svc, tenant: Tenant, assistant_id: ItemId) -> dict[str, Any]:
    """The assistant, by its id (the server's own also by its graph id)."""
    return await svc.assistants.get(tenant, assistant_id)


async def _matching(svc: Services, tenant: str, body: AssistantCount) -> list[dict[str, Any]]:
    return [
        found
        for found in await svc.assistants.all(tenant)
        if (body.graph_id is None or body.graph_id == found["graph_id"])
        and (body.name is None or body.name == found["name"])
        and all(found["metadata"].get(k) == v for k, v in (body.metadata or {}).items())
    ]
