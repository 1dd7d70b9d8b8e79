"""Changing threads: metadata (``PATCH``), a human edit of the state, a copy, a count.

As on LangGraph's server: an edit of the state runs the thread's graph's
``aupdate_state`` on the server's checkpointer (the graph its runs ran, named by the
thread's ``graph_id`` metadata; a thread no run has tagged answers 400, as there), and is
refused with 409 while a run of the thread is pending or running. A copy is a new thread
with the same metadata and every checkpoint of the original.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Response

from orchestrator.server.checkpoints import copy_checkpoints
from orchestrator.server.encoding import dumps
from orchestrator.server.errors import Conflict, RequestRefused
from orchestrator.server.guards import runlist
from orchestrator.server.guards.account import QuotaExceeded, size_of, state_field
from orchestrator.server.openapi import CONFLICT, NOT_FOUND, ErrorBody
from orchestrator.server.responses import Thread, ThreadUpdated
from orchestrator.server.routes.threads import COUNT_PAGE, existing_thread, thread_values
from orchestrator.server.runconfig import thread_config
from orchestrator.server.schemas import ThreadCount, ThreadId, ThreadPatch, ThreadStateUpdate
from orchestrator.server.selection import contains
from orchestrator.server.services import Svc, Tenant, json_response

router = APIRouter(prefix="/threads", tags=["threads"])

NO_GRAPH: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "No run has tagged the thread with its graph"}
}


@router.post("/count", response_model=int)
async def count_threads(svc: Svc, tenant: Tenant, body: ThreadCount) -> Response:
    """How many of the tenant's threads match the metadata, status and values given."""
    found = await svc.store.search_threads(
        tenant, limit=COUNT_PAGE, offset=0, metadata=body.metadata, status=body.status
    )
    if body.values is not None:
        wanted = body.values
        found = [r for r in found if contains(await thread_values(svc, r), wanted)]
    return json_response(len(found))


@router.patch("/{thread_id}", response_model=Thread, responses=NOT_FOUND)
async def patch_thread(
    svc: Svc, tenant: Tenant, thread_id: ThreadId, body: ThreadPatch
) -> Response:
    """Merge the metadata given into the thread's."""
    record = await existing_thread(svc, tenant, thread_id)
    await svc.store.merge_thread_metadata(record, body.metadata)
    return json_response(record.to_api(values=await thread_values(svc, record)))


@router.post("/{thread_id}/copy", response_model=Thread, responses=NOT_FOUND)
async def copy_thread(svc: Svc, tenant: Tenant, thread_id: ThreadId) -> Response:
    """A new thread with the original's metadata and all its checkpoints."""
    original = await existing_thread(svc, tenant, thread_id)
    copy, created = await svc.store.create_thread(tenant, str(uuid.uuid4()), original.metadata)
    if not created:  # a random UUID taken: not to be papered over
        raise Conflict("the new thread's id is taken; retry")
    quota = svc.store.quota
    if quota is not None:  # the state written to the original through the API is copied
        copied = await quota.size(tenant, state_field(original.thread_id))
        if copied:
            try:
                await quota.charge(tenant, state_field(copy.thread_id), copied)
            except QuotaExceeded:
                await svc.store.delete_thread(copy.key)
                raise
    await copy_checkpoints(svc.checkpointer, original.key, copy.key)
    return json_response(copy.to_api(values=await thread_values(svc, copy)))


@router.post(
    "/{thread_id}/state",
    response_model=ThreadUpdated,
    responses={**NOT_FOUND, **CONFLICT, **NO_GRAPH},
)
async def update_state(
    svc: Svc, tenant: Tenant, thread_id: ThreadId, body: ThreadStateUpdate
) -> Response:
    """Write ``values`` to the thread as node ``as_node`` (a new checkpoint after the one
    given, or after the latest); answers the new checkpoint."""
    record = await existing_thread(svc, tenant, thread_id)
    busy = await runlist.unfinished(svc.store, record.key)
    if busy:
        raise Conflict(f"thread {thread_id} has a {busy[0].status} run; wait for it or cancel it")
    graph_id = record.metadata.get("graph_id")
    source = svc.graphs.find(str(graph_id)) if graph_id else None
    if source is None:
        raise RequestRefused(
            f"thread {thread_id} has no graph: run it once, or set its metadata's graph_id"
        )
    config = thread_config(record.key, body.checkpoint_id)
    if body.checkpoint is not None:
        ref = body.checkpoint.model_dump(exclude_none=True, exclude={"thread_id"})
        config["configurable"].update(ref)
    config["configurable"].setdefault("checkpoint_ns", "")
    # The new checkpoint's metadata names its graph, as LangGraph's server's does.
    config["configurable"]["graph_id"] = source.graph_id
    if svc.store.quota is not None:  # every edit is a checkpoint more: its bytes add up
        size = size_of(dumps(body.values), body.as_node or "")
        await svc.store.quota.charge(tenant, state_field(thread_id), size, add=True)
    graph = await source.for_thread(record.key)
    written = await graph.aupdate_state(config, body.values, as_node=body.as_node)
    snapshot = await graph.aget_state(thread_config(record.key))
    await svc.store.set_thread_status(record.key, "interrupted" if snapshot.next else "idle")
    checkpoint = {**written["configurable"], "thread_id": thread_id}
    return json_response(
        {
            "checkpoint": checkpoint,
            "configurable": checkpoint,
            "checkpoint_id": checkpoint["checkpoint_id"],
        }
    )
