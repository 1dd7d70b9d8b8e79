"""``GET /threads/{thread_id}/stream`` (``threads.join_stream``): the thread's runs'
events as they come, one run after the other, for as long as the client listens.

As on LangGraph's server: every run of the thread that starts (or is still going) while
the client listens is streamed from its start, each run's events opened by its
``metadata`` event and closed by ``metadata`` ``{"status": "run_done", "run_id": ...}``;
``stream_mode`` ``run_modes`` (the default) sends all of them, ``lifecycle`` only the two
``metadata`` events of each run. With ``Last-Event-ID`` the runs already finished are
replayed too, from just after that event (event ids grow with time across a thread's
runs, so one id says where a client stopped in all of them; a run's opening ``metadata``
is sent again only for a run created after it). Between runs a comment line
keeps the connection open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from orchestrator.server.encoding import SSE_HEARTBEAT, dumps, sse_frame
from orchestrator.server.errors import Unsupported
from orchestrator.server.eventlog import END, FollowerDropped, parse_id
from orchestrator.server.openapi import NOT_FOUND
from orchestrator.server.records import RunRecord
from orchestrator.server.routes.threads import existing_thread
from orchestrator.server.schemas import ThreadId
from orchestrator.server.services import Services, Svc, Tenant
from orchestrator.server.streaming import HEARTBEAT

router = APIRouter(prefix="/threads", tags=["threads"])

POLL = 0.5
"""Seconds between looks for a new run of the thread while none runs."""

RUNS_READ = 1_000
"""Most recent runs of the thread each look reads."""

ThreadStreamMode = Literal["run_modes", "lifecycle", "state_update"]


@router.get(
    "/{thread_id}/stream",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
        **NOT_FOUND,
        422: {"description": "Last-Event-ID is not an event id"},
    },
    response_class=StreamingResponse,
)
async def join_thread_stream(
    svc: Svc,
    tenant: Tenant,
    thread_id: ThreadId,
    # Not "| None": a nullable query parameter is documented as taking the text "null".
    stream_mode: Annotated[list[ThreadStreamMode], Query()] = ["run_modes"],  # noqa: B006
    last_event_id: Annotated[str | None, Header(max_length=64)] = None,
) -> StreamingResponse:
    """Stream the thread's runs as they come (after ``Last-Event-ID``: replaying those
    since)."""
    record = await existing_thread(svc, tenant, thread_id)
    if last_event_id is not None:
        try:
            parse_id(last_event_id)
        except ValueError:
            raise Unsupported("Last-Event-ID is not an event id of this server") from None
    modes: set[str] = set(stream_mode)
    body = _frames(svc, record.key, modes, last_event_id)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


async def _frames(
    svc: Services, thread: str, modes: set[str], after: str | None
) -> AsyncIterator[bytes]:
    # Runs finished before the client came are history: only a resuming client gets them.
    seen = set() if after is not None else {r.run_id for r in await _runs(svc, thread) if r.done}
    quiet_since = time.monotonic()
    while True:
        fresh = [r for r in reversed(await _runs(svc, thread)) if r.run_id not in seen]
        if not fresh:
            if time.monotonic() - quiet_since >= HEARTBEAT:
                quiet_since = time.monotonic()
                yield SSE_HEARTBEAT
            await asyncio.sleep(POLL)
            continue
        run = fresh[0]  # the oldest: runs of a thread go one after the other
        seen.add(run.run_id)
        async for frame in _run_frames(svc, run, modes, after or "0-0"):
            yield frame
        quiet_since = time.monotonic()


async def _run_frames(
    svc: Services, run: RunRecord, modes: set[str], after: str
) -> AsyncIterator[bytes]:
    everything = "run_modes" in modes
    if parse_id(after)[0] < _ms(run.created_at):  # its start is news to the client
        yield sse_frame("metadata", dumps({"run_id": run.run_id, "attempt": 1}))
    async with svc.runs.relay.follow(run.run_id, after) as follower:
        while True:
            try:
                entry = await follower.next(timeout=HEARTBEAT)
            except FollowerDropped:
                break
            if entry is None:
                yield SSE_HEARTBEAT
                if (await svc.runs.refresh(run)).done and await _ended(svc, run):
                    break
                continue
            if entry.event == END:
                break
            if everything:
                yield sse_frame(entry.event, entry.data, entry.id)
    yield sse_frame("metadata", dumps({"status": "run_done", "run_id": run.run_id}))


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).timestamp() * 1000)


async def _ended(svc: Services, run: RunRecord) -> bool:
    last = await svc.runs.events.last(run.run_id)
    return last is None or last.event == END


async def _runs(svc: Services, thread: str) -> list[RunRecord]:
    """The thread's runs, newest first."""
    return await svc.store.runs(thread, limit=RUNS_READ, offset=0)
