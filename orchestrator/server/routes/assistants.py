"""Assistants: one, the agent this server runs (graph id ``agent``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from orchestrator.server.errors import NotFound
from orchestrator.server.graph import assistant, is_assistant
from orchestrator.server.schemas import Assistant, AssistantSearch
from orchestrator.server.services import Svc

router = APIRouter(prefix="/assistants", tags=["assistants"])


@router.post("/search", response_model=list[Assistant])
async def search_assistants(svc: Svc, body: AssistantSearch) -> list[dict[str, Any]]:
    """Assistants matching the graph id, name and metadata given."""
    found = assistant(svc.settings)
    matches = (
        (body.graph_id is None or body.graph_id == found["graph_id"])
        and (body.name is None or body.name == found["name"])
        and all(found["metadata"].get(k) == v for k, v in (body.metadata or {}).items())
    )
    return [found][body.offset : body.offset + body.limit] if matches else []


@router.get("/{assistant_id}", response_model=Assistant)
async def get_assistant(svc: Svc, assistant_id: str) -> dict[str, Any]:
    """The assistant, by its id or its graph id."""
    if not is_assistant(assistant_id):
        raise NotFound(f"assistant {assistant_id!r} not found")
    return assistant(svc.settings)
