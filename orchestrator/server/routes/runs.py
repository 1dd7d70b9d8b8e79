"""Runs: start (background, streamed, waited for), read, list, join, stream, cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import StreamingResponse

from orchestrator.server.encoding import dumps
from orchestrator.server.errors import Conflict, NotFound
from orchestrator.server.guards import runlist
from orchestrator.server.openapi import CONFLICT, JOIN_STREAM, NOT_FOUND, RUN_START, SSE
from orchestrator.server.records import RunRecord
from orchestrator.server.responses import Run
from orchestrator.server.routes.threads import existing_thread
from orchestrator.server.runconfig import thread_config
from orchestrator.server.schemas import (
    CancelAction,
    LimitQuery,
    NewThreadId,
    OffsetQuery,
    RunCreate,
    RunField,
    RunId,
    RunStatus,
    ThreadId,
)
from orchestrator.server.selection import picked
from orchestrator.server.services import Services, Svc, Tenant, json_response
from orchestrator.server.streaming import event_filter, event_id, run_locations, sse_response
from orchestrator.server.streamquota import Streams

router = APIRouter(tags=["runs"])

# -- starting runs ----------------------------------------------------------------------


WAIT_HEARTBEAT = 5.0
"""Seconds between the newlines that keep a ``wait`` or ``join`` connection open."""

FROM_THE_START = "-1"

CANCEL_ROUTE = "POST /threads/{thread_id}/runs/{run_id}/cancel"
"""The cancel route as a cancelled run's webhook names it (LangGraph's server's words)."""
"""The ``Last-Event-ID`` a client sends to replay a stream from its start."""


@router.post("/threads/{thread_id}/runs", response_model=Run, responses=RUN_START)
async def create_run(svc: Svc, tenant: Tenant, thread_id: NewThreadId, body: RunCreate) -> Any:
    """Start a background run on the thread."""
    run = await svc.runs.start_run(tenant, thread_id, body)
    return json_response(run.to_api(), headers=run_locations(run))


@router.post("/runs", response_model=Run, responses=RUN_START)
async def create_stateless_run(svc: Svc, tenant: Tenant, body: RunCreate) -> Any:
    """Start a background run on a new thread of its own."""
    run = await svc.runs.start_run(tenant, None, body)
    return json_response(run.to_api(), headers=run_locations(run))


@router.post(
    "/threads/{thread_id}/runs/stream",
    responses={**SSE, **RUN_START},
    response_class=StreamingResponse,
)
async def stream_run(
    svc: Svc, tenant: Tenant, thread_id: NewThreadId, body: RunCreate
) -> StreamingResponse:
    """Start a run on the thread and stream it (it goes on if the client leaves, unless
    ``on_disconnect`` is ``cancel``)."""
    return await _start_streaming(svc, tenant, thread_id, body)


@router.post("/runs/stream", responses={**SSE, **RUN_START}, response_class=StreamingResponse)
async def stream_stateless_run(svc: Svc, tenant: Tenant, body: RunCreate) -> StreamingResponse:
    """Start a run on a new thread of its own and stream it."""
    return await _start_streaming(svc, tenant, None, body)


@router.post("/threads/{thread_id}/runs/wait", responses=RUN_START)
async def wait_run(svc: Svc, tenant: Tenant, thread_id: NewThreadId, body: RunCreate) -> Any:
    """Start a run on the thread and answer with the thread's values once it is done."""
    return await _start_waiting(svc, tenant, thread_id, body)


@router.post("/runs/wait", responses=RUN_START)
async def wait_stateless_run(svc: Svc, tenant: Tenant, body: RunCreate) -> Any:
    """Start a run on a new thread of its own and answer with its final values."""
    return await _start_waiting(svc, tenant, None, body)


# -- existing runs ------------------------------------------------------------------------


@router.get("/threads/{thread_id}/runs", response_model=list[Run], responses=NOT_FOUND)
async def list_runs(
    svc: Svc,
    tenant: Tenant,
    thread_id: ThreadId,
    limit: LimitQuery = 10,
    offset: OffsetQuery = 0,
    # Neither "... | None": a nullable query parameter is documented as accepting the
    # text "null", which no status or field is.
    status: RunStatus = None,  # type: ignore[assignment]
    select: Annotated[list[RunField], Query()] = None,  # type: ignore[assignment]  # noqa: RUF013
) -> Any:
    """The thread's runs, newest first (only the fields of ``select`` if given)."""
    record = await existing_thread(svc, tenant, thread_id)
    runs = await runlist.runs_page(svc.store, record.key, limit=limit, offset=offset, status=status)
    return json_response([picked(r.to_api(), select) for r in runs])


@router.get("/threads/{thread_id}/runs/{run_id}", response_model=Run, responses=NOT_FOUND)
async def get_run(svc: Svc, tenant: Tenant, thread_id: ThreadId, run_id: RunId) -> Any:
    """The run."""
    return json_response((await svc.runs.get_run(tenant, thread_id, run_id)).to_api())


@router.delete(
    "/threads/{thread_id}/runs/{run_id}", status_code=204, responses={**NOT_FOUND, **CONFLICT}
)
async def delete_run(svc: Svc, tenant: Tenant, thread_id: ThreadId, run_id: RunId) -> Response:
    """Forget a finished run (409 while it runs: cancel it first)."""
    run = await svc.runs.get_run(tenant, thread_id, run_id)
    if not run.done:
        raise Conflict(f"run {run_id} is {run.status}; cancel it first")
    await svc.store.delete_run(run)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/runs/{run_id}/join", responses=NOT_FOUND)
async def join_run(
    svc: Svc,
    tenant: Tenant,
    thread_id: ThreadId,
    run_id: RunId,
    cancel_on_disconnect: bool = False,
) -> Any:
    """Wait until the run is done; answer with the thread's values. With
    ``cancel_on_disconnect``, a client that leaves first cancels the run."""
    run = await svc.runs.get_run(tenant, thread_id, run_id)
    return _waiting_response(svc, run, cancel_on_disconnect=cancel_on_disconnect)


@router.get(
    "/threads/{thread_id}/runs/{run_id}/stream",
    responses=JOIN_STREAM,
    response_class=StreamingResponse,
)
async def join_stream(
    svc: Svc,
    tenant: Tenant,
    streams: Streams,
    thread_id: ThreadId,
    run_id: RunId,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    cancel_on_disconnect: bool = False,
    last_event_id: Annotated[str | None, Header(max_length=64)] = None,
) -> StreamingResponse:
    """Stream the run from its start (or after ``Last-Event-ID``), whichever replica runs it:
    the modes the run was started with, or those of ``stream_mode``. Only a stream from the
    start opens with ``metadata``.

    ``Last-Event-ID: -1`` asks for the whole run again, as from the start (what
    langgraph-sdk's ``useStream`` sends to rejoin a run after a page reload). Any other
    ``Last-Event-ID`` that is not an event id of this server (``<ms>-<seq>``, ASCII
    digits, each part below 2**64) is a 422: resuming from the start instead would
    replay parts the client already has.
    """
    if last_event_id == FROM_THE_START:
        last_event_id = None
    run = await svc.runs.get_run(tenant, thread_id, run_id)
    after = event_id(last_event_id or "0-0")
    asked = [m for m in stream_mode or () if m]  # the SDK sends "stream_mode=" for none
    # As LangGraph's server: the modes the run streamed unless the client names some
    # (not the ``custom`` every run records), and no second ``metadata`` on a reconnect.
    return sse_response(
        svc.runs,
        run,
        events=event_filter(asked or run.kwargs.get("stream_mode") or ["values"]),
        after=after,
        cancel_on_disconnect=cancel_on_disconnect,
        metadata=last_event_id is None,
        release=streams.take(tenant),  # last: nothing after it may fail
    )


@router.post(
    "/threads/{thread_id}/runs/{run_id}/cancel",
    response_model=Run,
    responses={
        202: {"model": Run, "description": "Cancelling (without wait)"},
        **NOT_FOUND,
    },
)
async def cancel_run(
    svc: Svc,
    tenant: Tenant,
    thread_id: ThreadId,
    run_id: RunId,
    wait: bool = False,
    action: CancelAction = "interrupt",
) -> Any:
    """Cancel the run: its model call stops and its in-flight tool tasks are revoked.

    ``action=rollback`` also deletes the run and the checkpoints it wrote. With ``wait``,
    answers once the run has stopped. A finished run answers 404, as on LangGraph's
    server: there is no run to cancel.
    """
    run = await svc.runs.get_run(tenant, thread_id, run_id)
    try:
        await svc.runs.cancel(run, action, f"{action} requested via {CANCEL_ROUTE}")
    except Conflict:  # finished
        raise NotFound(f"run {run_id} has finished ({run.status}): nothing to cancel") from None
    if wait:
        try:
            run = await svc.runs.wait_done(run)
        except NotFound:  # rolled back: the record is gone
            run.status = "interrupted"
        return json_response(run.to_api())
    return json_response(run.to_api(), status_code=202)


# -- helpers --------------------------------------------------------------------------------


async def _start_streaming(
    svc: Services, tenant: str, thread_id: str | None, body: RunCreate
) -> StreamingResponse:
    run = await svc.runs.start_run(tenant, thread_id, body)
    return sse_response(
        svc.runs,
        run,
        events=event_filter(body.stream_mode),
        cancel_on_disconnect=body.on_disconnect == "cancel",
    )


async def _start_waiting(
    svc: Services, tenant: str, thread_id: str | None, body: RunCreate
) -> Response:
    run = await svc.runs.start_run(tenant, thread_id, body)
    return _waiting_response(svc, run, cancel_on_disconnect=body.on_disconnect == "cancel")


def _waiting_response(
    svc: Services, run: RunRecord, *, cancel_on_disconnect: bool
) -> StreamingResponse:
    """What ``wait`` and ``join`` answer, as LangGraph's server does: the head at once
    (``Location``: the run's join), a newline every :data:`WAIT_HEARTBEAT` seconds while
    the run goes on, then the final values. A client whose connection is cut (a replica
    that went away) reconnects to ``Location`` on another replica; one that leaves first
    cancels the run if it asked to."""

    async def body() -> AsyncIterator[bytes]:
        waiter = asyncio.create_task(svc.runs.wait_done(run))
        answered = False
        try:
            while not (await asyncio.wait({waiter}, timeout=WAIT_HEARTBEAT))[0]:
                yield b"\n"  # leading whitespace: JSON readers skip it
            try:
                values = await _final_values(svc, waiter.result())
            except NotFound as exc:
                values = {"__error__": {"error": "NotFound", "message": str(exc)}}
            answered = True
            yield dumps(values)
        finally:
            waiter.cancel()
            if cancel_on_disconnect and not answered:
                svc.runs.cancel_soon(run)

    headers = {**run_locations(run, "join"), "Cache-Control": "no-store"}
    return StreamingResponse(body(), media_type="application/json", headers=headers)


async def _final_values(svc: Services, run: RunRecord) -> Any:
    """What ``wait`` and ``join`` answer: the thread's values, or the run's error."""
    if run.status == "error":
        return {"__error__": run.error or {"error": "Error", "message": "run failed"}}
    if (thread := await svc.store.thread(run.thread_key)) is not None:
        graph = await svc.graphs.for_thread(run.thread_key, thread.metadata)
        snapshot = await graph.aget_state(thread_config(run.thread_key))
        return snapshot.values
    # A run without a thread of its own: its thread is gone, its last values are logged.
    last = await svc.runs.events.last_of(run.run_id, "values")
    if last is None:
        raise NotFound(f"run {run.run_id} recorded no values and its thread is gone")
    return last
