"""Runs by the handful: start a batch of stateless runs, cancel many runs at once.

As on LangGraph's server: ``POST /runs/batch`` starts each run of the list on a thread of
its own and answers the runs; ``POST /runs/cancel`` cancels either the runs ``run_ids``
of thread ``thread_id``, or every run of the tenant with a ``status`` (``pending``,
``running`` or ``all`` of those two), answers 204, and 404 when it matches no run that is
pending or running (``action=rollback`` deletes each with the checkpoints it wrote).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Response
from pydantic import ConfigDict, Field

from orchestrator.server.errors import Conflict, NotFound
from orchestrator.server.guards import runlist
from orchestrator.server.openapi import AT_CAPACITY, NOT_FOUND
from orchestrator.server.records import RunRecord
from orchestrator.server.responses import Run
from orchestrator.server.routes.threads import COUNT_PAGE, existing_thread
from orchestrator.server.schemas import CancelAction, Id, RequestBody, RunCreate
from orchestrator.server.services import Services, Svc, Tenant, json_response

router = APIRouter(prefix="/runs", tags=["runs"])

MAX_BATCH = 100
"""Most runs one batch starts."""

RUNS_PER_THREAD = 10_000
"""Most runs of one thread a cancel reads."""


class CancelByIds(RequestBody):
    """Body of ``POST /runs/cancel`` naming the runs: these runs of this thread."""

    model_config = ConfigDict(extra="forbid")  # a status beside them is a 422, as there

    thread_id: Id
    run_ids: Annotated[list[Id], Field(max_length=1000)]


class CancelByStatus(RequestBody):
    """Body of ``POST /runs/cancel`` by status: every run of the tenant with it."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["pending", "running", "all"]
    """``all``: pending and running."""


RunsCancel = CancelByIds | CancelByStatus


@router.post("/batch", response_model=list[Run], responses={**NOT_FOUND, **AT_CAPACITY})
async def create_batch(
    svc: Svc,
    tenant: Tenant,
    body: Annotated[list[RunCreate], Body(min_length=1, max_length=MAX_BATCH)],
) -> Response:
    """Start each run on a new thread of its own (at most ``MAX_BATCH``)."""
    # One by one: a refusal (an unknown assistant, the tenant's share full) stops the
    # batch there, and the runs before it go on, as runs started one request each would.
    runs = [await svc.runs.start_run(tenant, None, run) for run in body]
    return json_response([run.to_api() for run in runs])


@router.post("/cancel", status_code=204, responses=NOT_FOUND)
async def cancel_many(
    svc: Svc, tenant: Tenant, body: RunsCancel, action: CancelAction = "interrupt"
) -> Response:
    """Cancel the runs selected; their in-flight tool tasks are revoked. ``rollback``
    also deletes each run with the checkpoints it wrote."""
    cancelable = [run for run in await _selected(svc, tenant, body) if not run.done]
    if not cancelable:
        raise NotFound("no pending or running runs found to cancel")
    await asyncio.gather(*(_cancel(svc, run, action) for run in cancelable))
    return Response(status_code=204)


async def _cancel(svc: Services, run: RunRecord, action: CancelAction) -> None:
    with contextlib.suppress(Conflict):  # it finished meanwhile: nothing left to cancel
        await svc.runs.cancel(run, action, f"{action} requested via POST /runs/cancel")


async def _selected(svc: Services, tenant: str, body: RunsCancel) -> list[RunRecord]:
    if isinstance(body, CancelByIds):
        record = await existing_thread(svc, tenant, body.thread_id)
        wanted = set(body.run_ids)
        runs = runlist.walk(svc.store, record.key, most=RUNS_PER_THREAD)
        return [run async for run in runs if run.run_id in wanted]
    statuses = ("pending", "running") if body.status == "all" else (body.status,)
    found: list[RunRecord] = []
    for thread in await svc.store.search_threads(tenant, limit=COUNT_PAGE, offset=0):
        runs = runlist.walk(svc.store, thread.key, most=RUNS_PER_THREAD)
        found.extend([run async for run in runs if run.status in statuses])
    return found
