"""``GET /threads/{thread_id}/stream`` (``threads.join_stream``): the thread's runs'
events as they come, one run after the other, for as long as the client listens.

As on LangGraph's server: every run of the thread that starts (or is still going) while
the client listens is streamed from its start, each run's events opened by its
``metadata`` event and closed by ``metadata`` ``{"status": "run_done", "run_id": ...}``;
``stream_modes`` (or ``stream_mode``, the name the Python client sends) ``run_modes`` (the
default) sends all of them, ``lifecycle`` only the two ``metadata`` events of each run.
With ``Last-Event-ID`` the runs already finished are replayed too, from just after that
event (event ids grow with time across a thread's runs, so one id says where a client
stopped in all of them; a run's opening ``metadata`` is sent again only for a run created
after it). Between runs a comment line keeps the connection open.

What a listener costs does not grow with the thread's history: while no run streams,
each look for a new run reads the ids of the thread's :data:`WATCH` newest runs (one
sorted-set read) and only the records of ids it has not seen; joining reads the newest
:data:`JOIN_WINDOW` records (:data:`REPLAY_WINDOW` with ``Last-Event-ID``) in one round
trip. A run still going that is older than those windows is not streamed (a thread's
runs go one after the other: the one going is among its newest). Each tenant holds at
most ``TOOLFLEET_TENANT_MAX_STREAMS`` streams open on a replica (429 beyond).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from pydantic import StringConstraints

from orchestrator.server.encoding import SSE_HEARTBEAT, dumps, sse_frame
from orchestrator.server.eventlog import END, FollowerDropped, parse_id
from orchestrator.server.guards import runlist
from orchestrator.server.openapi import JOIN_STREAM
from orchestrator.server.records import RunRecord
from orchestrator.server.routes.threads import existing_thread
from orchestrator.server.schemas import ThreadId
from orchestrator.server.services import Services, Svc, Tenant
from orchestrator.server.streaming import HEARTBEAT, HeldStreamingResponse, event_id
from orchestrator.server.streamquota import Streams

router = APIRouter(prefix="/threads", tags=["threads"])

POLL = 0.5
"""Seconds between looks for a new run of the thread while none runs."""

WATCH = 16
"""Newest run ids of the thread each look reads (more when all of them are new)."""

JOIN_WINDOW = 32
"""Newest runs whose records a listener reads as it joins (to find those still going)."""

REPLAY_WINDOW = 1_000
"""Newest runs a listener resuming with ``Last-Event-ID`` considers for the replay."""

ThreadStreamMode = Literal["run_modes", "lifecycle", "state_update"]

_MODE = "(run_modes|lifecycle|state_update)"
StreamModes = Annotated[str, StringConstraints(max_length=200, pattern=f"^{_MODE}(,{_MODE})*$")]
"""One ``stream_modes`` value: a mode, or modes joined by commas (as LangGraph's server
reads them)."""


@router.get(
    "/{thread_id}/stream",
    responses=JOIN_STREAM,
    response_class=StreamingResponse,
)
async def join_thread_stream(
    svc: Svc,
    tenant: Tenant,
    streams: Streams,
    thread_id: ThreadId,
    # Not "| None": a nullable query parameter is documented as taking the text "null".
    stream_mode: Annotated[list[ThreadStreamMode], Query()] = ["run_modes"],  # noqa: B006
    stream_modes: Annotated[
        list[StreamModes],
        Query(
            max_length=10,
            description="The modes, as LangGraph's server names the parameter (a mode, "
            "or modes joined by commas; repeated too); it wins over ``stream_mode``",
        ),
    ] = [],  # noqa: B006
    last_event_id: Annotated[str | None, Header(max_length=64)] = None,
) -> StreamingResponse:
    """Stream the thread's runs as they come (after ``Last-Event-ID``: replaying those
    since)."""
    record = await existing_thread(svc, tenant, thread_id)
    if last_event_id is not None:
        event_id(last_event_id)
    named = {mode for value in stream_modes for mode in value.split(",")}
    modes: set[str] = named or set(stream_mode)
    body = _frames(svc, record.key, modes, last_event_id)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return HeldStreamingResponse(
        body,
        release=streams.take(tenant),  # last: nothing after it may fail
        media_type="text/event-stream",
        headers=headers,
    )


async def _frames(
    svc: Services, thread: str, modes: set[str], after: str | None
) -> AsyncIterator[bytes]:
    recent = await newest_runs(svc, thread, REPLAY_WINDOW if after is not None else JOIN_WINDOW)
    seen = {r.run_id for r in recent}
    if after is None:  # runs finished before the client came are history
        due = [r for r in reversed(recent) if not r.done]
    else:  # a resuming client gets those that went on after its last event
        since = parse_id(after)[0]
        due = [r for r in reversed(recent) if not r.done or _ms(r.updated_at) >= since]
    async for run in thread_runs(svc, thread, seen, due):
        if run is None:
            yield SSE_HEARTBEAT
            continue
        async for frame in _run_frames(svc, run, modes, after or "0-0"):
            yield frame


async def thread_runs(
    svc: Services, thread: str, seen: set[str], due: list[RunRecord]
) -> AsyncIterator[RunRecord | None]:
    """The thread's runs one after the other, oldest first: ``due``, then each new one
    (not in ``seen``) as it comes; ``None`` when a heartbeat is due while none comes.
    The next run is looked for once the caller has streamed the one before."""
    quiet_since = time.monotonic()
    while True:
        if not due:
            due = await _new_runs(svc, thread, seen)
        if not due:
            if time.monotonic() - quiet_since >= HEARTBEAT:
                quiet_since = time.monotonic()
                yield None
            await asyncio.sleep(POLL)
            continue
        yield due.pop(0)
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


async def newest_runs(svc: Services, thread: str, count: int) -> list[RunRecord]:
    """The thread's ``count`` newest runs, newest first (one page of
    :mod:`orchestrator.server.guards.runlist`)."""
    return await runlist.newest_runs(svc.store, thread, count)


async def _new_runs(svc: Services, thread: str, seen: set[str]) -> list[RunRecord]:
    """Runs of the thread not in ``seen``, oldest first; ``seen`` becomes the ids read
    (the :data:`WATCH` newest, more while all are new, up to :data:`REPLAY_WINDOW`)."""
    return await runlist.new_runs(svc.store, thread, seen, watch=WATCH, most=REPLAY_WINDOW)
