"""Assistants: one per graph the server runs (the built-in ``agent``, or a project's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from orchestrator.server.openapi import NOT_FOUND
from orchestrator.server.schemas import Assistant, AssistantSearch, ItemId
from orchestrator.server.services import Svc

router = APIRouter(prefix="/assistants", tags=["assistants"])


@router.post("/search", response_model=list[Assistant])
async def search_assistants(svc: Svc, body: AssistantSearch) -> list[dict[str, Any]]:
    """Assistants matching the graph id, name and metadata given."""
    matches = [
        found
        for found in svc.graphs.assistants()
        if (body.graph_id is None or body.graph_id == found["graph_id"])
        and (body.name is None or body.name == found["name"])
        and all(found["metadata"].get(k) == v for k, v in (body.metadata or {}).items())
    ]
    return matches[body.offset : body.offset + body.limit]


@router.get("/{assistant_id}", response_model=Assistant, responses=NOT_FOUND)
async def get_assistant(svc: Svc, assistant_id: ItemId) -> dict[str, Any]:
    """The assistant, by its id or its graph id."""
    return svc.graphs.get(assistant_id).assistant()
