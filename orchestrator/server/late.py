"""Late results in a served thread's record, under its metadata.

A call of a served run answered as lost may still have run to the end: when its result
comes afterwards, the replica that sent the call hears it (:mod:`orchestrator.dispatch.late`)
and adds it to the thread's metadata under :data:`METADATA_KEY`, with its call id, where
the thread's owner reads the thread (``GET /threads/{thread_id}``). ``toolfleet late
<tenant>/<thread id>`` reads the same results when no replica was there to hear them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.dispatch.late import LateResult, LostCalls
from orchestrator.server.store import Store

log = logging.getLogger("toolfleet.server")

METADATA_KEY = "toolfleet_late_results"
"""Thread metadata key listing the thread's late results (one entry per call)."""

CONTENT_CHARS = 2000
"""A late result's text is cut to this many characters in the thread's metadata."""


def entry(late: LateResult) -> dict[str, Any]:
    """A late result as the thread's metadata lists it."""
    return {
        "call_id": late.call_id,
        "tool": late.tool,
        "run_id": late.run_id,
        "answered": late.answered,
        "came_at": late.came_at,
        "status": late.status,
        "error_kind": late.error_kind,
        "content": late.content[:CONTENT_CHARS],
    }


async def record_late(store: Store, late: LateResult) -> bool:
    """Add ``late`` to its thread's metadata (once per call); whether it was added."""
    if late.thread_id is None or late.call_id is None:
        return False
    record = await store.thread(late.thread_id)
    if record is None:  # deleted, or expired
        return False
    listed = list(record.metadata.get(METADATA_KEY) or [])
    if any(isinstance(e, dict) and e.get("call_id") == late.call_id for e in listed):
        return False
    await store.merge_thread_metadata(record, {METADATA_KEY: [*listed, entry(late)]})
    return True


def install(lost: LostCalls, store: Store, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Record every late result ``lost`` hears in its thread, on ``loop``; the function
    returned stops it."""

    def heard(late: LateResult) -> None:
        future = asyncio.run_coroutine_threadsafe(record_late(store, late), loop)
        future.add_done_callback(_failed)

    return lost.on_late(heard)


def _failed(future: concurrent.futures.Future[bool]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("could not record a late result: %r", future.exception())
