"""Threads: create, read, search, delete; their state and history from the checkpointer."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from orchestrator.server.checkpoints import thread_storage
from orchestrator.server.encoding import thread_state
from orchestrator.server.errors import Conflict, NotFound
from orchestrator.server.guards import runlist
from orchestrator.server.keys import Keys
from orchestrator.server.openapi import CONFLICT, NOT_FOUND
from orchestrator.server.records import ThreadRecord
from orchestrator.server.responses import (
    SELECTED_THREADS,
    PruneResult,
    Thread,
    ThreadState,
    ThreadStorage,
)
from orchestrator.server.runconfig import thread_config
from orchestrator.server.schemas import (
    ID_MAX_CHARS,
    CheckpointRef,
    HistoryRequest,
    ItemId,
    LimitQuery,
    StateAtCheckpoint,
    ThreadCreate,
    ThreadId,
    ThreadPrune,
    ThreadSearch,
)
from orchestrator.server.selection import contains, extracted, picked
from orchestrator.server.services import Services, Svc, Tenant, json_response
from orchestrator.server.supersteps import history_graph, write_history
from orchestrator.server.tenancy import thread_key

router = APIRouter(prefix="/threads", tags=["threads"])

COUNT_PAGE = 1_000_000
"""Most threads a search or count reads (the whole index of any real tenant)."""


async def existing_thread(svc: Services, tenant: str, thread_id: str) -> ThreadRecord:
    """The record of the tenant's thread.

    Raises:
        NotFound: no such thread, or it is another tenant's (the same answer: whether
            another tenant has a thread of that id is not for this one to learn).
    """
    record = await svc.store.thread(thread_key(tenant, thread_id))
    if record is None:
        raise NotFound(f"thread {thread_id} not found")
    return record


_NO_GRAPH: dict[int | str, dict[str, Any]] = {
    400: {"description": "supersteps without a graph_id of this server in metadata"}
}


@router.post("", response_model=Thread, responses={**CONFLICT, **_NO_GRAPH})
async def create_thread(svc: Svc, tenant: Tenant, body: ThreadCreate) -> Response:
    """Create a thread (``if_exists``: ``raise`` answers 409, ``do_nothing`` returns it),
    with the history of ``supersteps`` if given (written only to a thread it creates)."""
    thread_id = body.thread_id or str(uuid.uuid4())
    source = history_graph(svc, body.metadata) if body.supersteps else None
    record, created = await svc.store.create_thread(tenant, thread_id, body.metadata)
    if not created and body.if_exists == "raise":
        raise Conflict(f"thread {thread_id} already exists")
    if created and source is not None and body.supersteps:
        try:
            await write_history(svc, source, record, body.supersteps)
        except BaseException:
            await svc.checkpointer.adelete_thread(record.key)
            await svc.store.delete_thread(record.key)
            raise
        record = await existing_thread(svc, tenant, thread_id)
        created = False  # it has values now
    return json_response(
        record.to_api(values=await thread_values(svc, record) if not created else None)
    )


@router.post("/search", response_model=SELECTED_THREADS)
async def search_threads(svc: Svc, tenant: Tenant, body: ThreadSearch) -> Response:
    """The tenant's threads matching the metadata, status and ids given, in the order
    asked for (default: the most recently updated first)."""
    by_values = body.values is not None
    records = await svc.store.search_threads(
        tenant,
        # Filtering by values reads every candidate's state: the page is cut after it.
        limit=COUNT_PAGE if by_values else body.limit,
        offset=0 if by_values else body.offset,
        metadata=body.metadata,
        status=body.status,
        ids=body.ids,
        sort_by=body.sort_by or "updated_at",
        descending=body.sort_order != "asc",
    )
    threads = [r.to_api(values=await thread_values(svc, r)) for r in records]
    if body.values is not None:
        wanted = body.values
        threads = [t for t in threads if contains(t["values"], wanted)]
        threads = threads[body.offset : body.offset + body.limit]
    if body.extract:
        threads = [{**t, "extracted": extracted(t, body.extract)} for t in threads]
    if body.select:  # the extracted values stay: they were asked for too
        threads = [picked(t, [*body.select, "extracted"]) for t in threads]
    return json_response(threads)


@router.post("/prune", response_model=PruneResult)
async def prune_threads(svc: Svc, tenant: Tenant, body: ThreadPrune) -> Response:
    """Delete the tenant's threads of ``thread_ids`` (their runs cancelled, their
    checkpoints deleted), counting those deleted; ids of no thread of the tenant's are
    skipped. ``strategy`` ``keep_latest`` is a 422 (not implemented)."""
    pruned = 0
    for thread_id in dict.fromkeys(body.thread_ids):
        record = await svc.store.thread(thread_key(tenant, thread_id))
        if record is not None:
            await remove_thread(svc, record)
            pruned += 1
    return json_response({"pruned_count": pruned})


INCLUDE = r"^ *(ttl)? *(, *(ttl)? *)*$"
"""``include`` of ``GET /threads/{id}``: what it adds to the thread (``ttl`` alone)."""


@router.get("/{thread_id}", response_model=Thread, responses=NOT_FOUND)
async def get_thread(
    svc: Svc,
    tenant: Tenant,
    thread_id: ThreadId,
    include: Annotated[
        str,
        Query(
            max_length=200,
            pattern=INCLUDE,
            description="comma-separated: ``ttl``, the thread's expiry",
        ),
    ] = "",
) -> Response:
    """The thread, with the values of its latest checkpoint (and with ``include=ttl``
    when it expires: every thread is deleted ``TOOLFLEET_THREAD_TTL`` after its last
    change). An ``include`` of anything else is a 422 naming it."""
    fields = {f.strip() for f in include.split(",") if f.strip()}
    record = await existing_thread(svc, tenant, thread_id)
    thread = record.to_api(values=await thread_values(svc, record))
    if "ttl" in fields and (ttl := await thread_ttl(svc, record)) is not None:
        thread["ttl"] = ttl
    return json_response(thread)


async def thread_ttl(svc: Services, record: ThreadRecord) -> dict[str, Any] | None:
    """When the thread will be deleted, as LangGraph's server's ``ThreadTTLInfo``
    (``None`` if its record has no expiry)."""
    left_ms = await svc.redis.pttl(Keys(svc.settings.key_prefix).thread(record.key))
    if left_ms < 0:
        return None
    left = timedelta(milliseconds=left_ms)
    return {
        "strategy": "delete",
        "ttl_minutes": svc.settings.thread_ttl / 60,
        "expires_at": (datetime.now(UTC) + left).isoformat(),
    }


@router.delete("/{thread_id}", status_code=204, responses=NOT_FOUND)
async def delete_thread(svc: Svc, tenant: Tenant, thread_id: ThreadId) -> Response:
    """Cancel the thread's runs, delete its checkpoints and its records."""
    await remove_thread(svc, await existing_thread(svc, tenant, thread_id))
    return Response(status_code=204)


async def remove_thread(svc: Services, record: ThreadRecord) -> None:
    """Cancel the thread's runs, delete its checkpoints and its records."""
    for run in await runlist.unfinished(svc.store, record.key):
        with contextlib.suppress(Conflict):  # it finished meanwhile
            await svc.runs.cancel(run)
    await svc.checkpointer.adelete_thread(record.key)
    await svc.store.delete_thread(record.key)


@router.get("/{thread_id}/storage", response_model=ThreadStorage, responses=NOT_FOUND)
async def get_storage(svc: Svc, tenant: Tenant, thread_id: ThreadId) -> Response:
    """The bytes the thread's checkpoints occupy: checkpoints, channel values (per
    channel, each version once) and pending writes, as the checkpointer serializes them."""
    record = await existing_thread(svc, tenant, thread_id)
    report = await thread_storage(svc.checkpointer, record.key)
    return json_response({"thread_id": thread_id, **report})


@router.get("/{thread_id}/state", response_model=ThreadState, responses=NOT_FOUND)
async def get_state(
    svc: Svc, tenant: Tenant, thread_id: ThreadId, subgraphs: bool = False
) -> Response:
    """The thread's latest checkpoint."""
    return await _state(svc, tenant, thread_id, None, subgraphs)


@router.get("/{thread_id}/state/{checkpoint_id}", response_model=ThreadState, responses=NOT_FOUND)
async def get_state_at(
    svc: Svc, tenant: Tenant, thread_id: ThreadId, checkpoint_id: ItemId, subgraphs: bool = False
) -> Response:
    """One checkpoint of the thread."""
    return await _state(svc, tenant, thread_id, checkpoint_id, subgraphs)


@router.post("/{thread_id}/state/checkpoint", response_model=ThreadState, responses=NOT_FOUND)
async def post_state_at(
    svc: Svc, tenant: Tenant, thread_id: ThreadId, body: StateAtCheckpoint
) -> Response:
    """One checkpoint of the thread (the checkpoint in the body)."""
    return await _state(svc, tenant, thread_id, body.checkpoint.checkpoint_id, body.subgraphs)


@router.post("/{thread_id}/history", response_model=list[ThreadState], responses=NOT_FOUND)
async def post_history(
    svc: Svc, tenant: Tenant, thread_id: ThreadId, body: HistoryRequest
) -> Response:
    """The thread's checkpoints, newest first."""
    before = body.before.checkpoint_id if isinstance(body.before, CheckpointRef) else body.before
    start = body.checkpoint.checkpoint_id if body.checkpoint else None
    return await _history(svc, tenant, thread_id, body.limit, before, start, body.metadata)


@router.get("/{thread_id}/history", response_model=list[ThreadState], responses=NOT_FOUND)
async def get_history(
    svc: Svc,
    tenant: Tenant,
    thread_id: ThreadId,
    limit: LimitQuery = 10,
    before: Annotated[str | None, Query(max_length=ID_MAX_CHARS)] = None,
) -> Response:
    """The thread's checkpoints, newest first (the query-string form)."""
    return await _history(svc, tenant, thread_id, limit, before, None, None)


async def thread_values(svc: Services, record: ThreadRecord) -> Any:
    """The values of the thread's latest checkpoint; ``None`` before it has one."""
    graph = await svc.graphs.for_thread(record.key, record.metadata)
    snapshot = await graph.aget_state(thread_config(record.key))
    return snapshot.values if snapshot.created_at is not None else None


async def _state(
    svc: Services, tenant: str, thread_id: str, checkpoint_id: str | None, subgraphs: bool
) -> Response:
    record = await existing_thread(svc, tenant, thread_id)
    graph = await svc.graphs.for_thread(record.key, record.metadata)
    config = thread_config(record.key, checkpoint_id)
    snapshot = await graph.aget_state(config, subgraphs=subgraphs)
    return json_response(thread_state(snapshot, thread_id))


async def _history(
    svc: Services,
    tenant: str,
    thread_id: str,
    limit: int,
    before: str | None,
    start: str | None,
    metadata: dict[str, Any] | None,
) -> Response:
    record = await existing_thread(svc, tenant, thread_id)
    graph = await svc.graphs.for_thread(record.key, record.metadata)
    states = [
        thread_state(snapshot, thread_id)
        async for snapshot in graph.aget_state_history(
            thread_config(record.key, start),
            filter=metadata,
            before=thread_config(record.key, before) if before else None,
            limit=limit,
        )
    ]
    return json_response(states)
