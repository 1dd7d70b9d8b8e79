"""Creating and changing assistants: a graph with a config of the tenant's own, versioned
(:mod:`orchestrator.server.assistant_store`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from orchestrator.server.openapi import CONFLICT, NOT_FOUND
from orchestrator.server.responses import Assistant, AssistantVersion
from orchestrator.server.routes.threads import COUNT_PAGE, remove_thread
from orchestrator.server.schemas import (
    AssistantCreate,
    AssistantLatest,
    AssistantPatch,
    AssistantVersionsSearch,
    ItemId,
)
from orchestrator.server.services import Svc, Tenant

router = APIRouter(prefix="/assistants", tags=["assistants"])

BOTH = {**NOT_FOUND, **CONFLICT}


@router.post("", response_model=Assistant, responses=BOTH)
async def create_assistant(svc: Svc, tenant: Tenant, body: AssistantCreate) -> dict[str, Any]:
    """A new assistant of one of the server's graphs (409 if the id is taken, unless
    ``if_exists`` is ``do_nothing``)."""
    return await svc.assistants.create(tenant, body)


@router.patch("/{assistant_id}", response_model=Assistant, responses=BOTH)
async def patch_assistant(
    svc: Svc, tenant: Tenant, assistant_id: ItemId, body: AssistantPatch
) -> dict[str, Any]:
    """A new version of the assistant, made current (the server's own: 409)."""
    return await svc.assistants.patch(tenant, assistant_id, body)


@router.delete("/{assistant_id}", status_code=204, responses=BOTH)
async def delete_assistant(
    svc: Svc, tenant: Tenant, assistant_id: ItemId, delete_threads: bool = False
) -> Response:
    """Forget the assistant and its versions (the server's own: 409); with
    ``delete_threads``, also the tenant's threads it ran on (its id in their metadata),
    as ``DELETE /threads/{id}`` deletes a thread; otherwise they stay."""
    await svc.assistants.delete(tenant, assistant_id)
    if delete_threads:
        tagged = {"assistant_id": assistant_id}
        for record in await svc.store.search_threads(
            tenant, limit=COUNT_PAGE, offset=0, metadata=tagged
        ):
            await remove_thread(svc, record)
    return Response(status_code=204)


@router.post("/{assistant_id}/versions", response_model=list[AssistantVersion], responses=NOT_FOUND)
async def assistant_versions(
    svc: Svc, tenant: Tenant, assistant_id: ItemId, body: AssistantVersionsSearch
) -> list[dict[str, Any]]:
    """The assistant's versions, newest first, filtered by metadata."""
    found = await svc.assistants.versions(
        tenant, assistant_id, body.metadata or {}, body.limit, body.offset
    )
    return found


@router.post("/{assistant_id}/latest", response_model=Assistant, responses=BOTH)
async def set_latest_version(
    svc: Svc, tenant: Tenant, assistant_id: ItemId, body: AssistantLatest
) -> dict[str, Any]:
    """The assistant with one of its versions made current again."""
    return await svc.assistants.set_latest(tenant, assistant_id, body.version)
