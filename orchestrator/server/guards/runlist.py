"""A thread's runs, read by page: the one reader of a thread's runs every surface uses
(the REST runs list, the thread streams, A2A ``tasks/get`` and ``ListTasks``, cancels,
state edits and deletes).

A thread's run ids are a sorted set, by creation time. A page is one ``ZREVRANGE`` of the
ids it covers and one pipelined read of their records, so what a request costs follows
the page it asks for, not the thread's history: ``GET /threads/{id}/runs?limit=1`` is
two commands whether the thread ran once or ten thousand times. A walk (a filter, a
search for a task's latest run) reads pages that start small and double up to
:data:`PAGE`, and stops as soon as its caller has what it looks for.

An id whose record has expired is dropped from the set as a read meets it, and the read
goes on past it. Positions (``offset``) count ids in the set: an expired run not yet met
by any read still takes its place until one meets it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from orchestrator.server.records import RunRecord

__all__ = [
    "FIRST_PAGE",
    "PAGE",
    "RunIndex",
    "new_runs",
    "newest_runs",
    "runs_page",
    "unfinished",
    "walk",
]


class RunIndex(Protocol):
    """What the reader needs of the store (:class:`orchestrator.server.store.Store`)."""

    async def run_ids(self, thread: str, start: int, count: int) -> list[str]:
        """Ids of the thread's runs at positions ``start`` to ``start + count - 1``, the
        newest at 0 (one read)."""
        ...

    async def run_records(self, run_ids: list[str]) -> list[RunRecord | None]:
        """The records of these runs, in that order (``None``: expired; one round trip)."""
        ...

    async def forget_run_ids(self, thread: str, run_ids: list[str]) -> None:
        """Drop these ids (of runs whose records expired) from the thread's runs."""
        ...


PAGE = 100
"""Most run records one round trip reads."""

FIRST_PAGE = 8
"""Records a walk reads first (it doubles from there): most walks stop in the newest."""

MOST_UNFINISHED = 10_000
"""Most runs of a thread looked through for one still going."""


async def walk(
    store: RunIndex,
    thread: str,
    *,
    start: int = 0,
    most: int | None = None,
    first: int = FIRST_PAGE,
) -> AsyncIterator[RunRecord]:
    """The runs of the thread with key ``thread``, newest first, from position ``start``,
    at most ``most`` of them: read by page, the next page only once the caller asks for
    a run past the last one read.

    Args:
        store: The service's records.
        thread: The thread key (``<tenant>/<thread id>``).
        start: Runs (positions in the thread's index) to skip, the newest first.
        most: Most runs yielded (``None``: every one).
        first: Records the first page reads; each next page reads twice as many, up to
            :data:`PAGE`.
    """
    position, yielded, size = start, 0, max(1, min(first, PAGE))
    # Runs created meanwhile push the older ones down: a run is never yielded twice.
    seen: set[str] = set()
    while most is None or yielded < most:
        wanted = size if most is None else min(size, most - yielded)
        ids = await store.run_ids(thread, position, wanted)
        if not ids:
            return
        records = await store.run_records(ids)
        gone = [run_id for run_id, record in zip(ids, records, strict=True) if record is None]
        if gone:
            await store.forget_run_ids(thread, gone)
        position += len(ids) - len(gone)
        for record in records:
            if record is None or record.run_id in seen:
                continue
            seen.add(record.run_id)
            yield record
            yielded += 1
            if most is not None and yielded >= most:
                return
        if len(ids) < wanted:
            return
        size = min(size * 2, PAGE)


async def runs_page(
    store: RunIndex, thread: str, *, limit: int, offset: int = 0, status: str | None = None
) -> list[RunRecord]:
    """One page of the thread's runs, newest first: ``limit`` runs after ``offset``
    (of those with ``status``, if given).

    Without ``status`` the page is read where it lies (``limit`` records: one round trip
    for the ids, one for the records); with it, the thread's runs are walked from the
    newest until the page is full.
    """
    if status is None:
        return [r async for r in walk(store, thread, start=offset, most=limit, first=limit)]
    found: list[RunRecord] = []
    skip = offset
    async for run in walk(store, thread, first=limit + offset):
        if run.status != status:
            continue
        if skip:
            skip -= 1
            continue
        found.append(run)
        if len(found) >= limit:
            break
    return found


async def newest_runs(store: RunIndex, thread: str, count: int) -> list[RunRecord]:
    """The thread's ``count`` newest runs, newest first (one page)."""
    return await runs_page(store, thread, limit=count)


async def unfinished(store: RunIndex, thread: str) -> list[RunRecord]:
    """The thread's runs still going (pending or running), newest first: the newest
    :data:`MOST_UNFINISHED` runs are looked through, a page at a time."""
    return [r async for r in walk(store, thread, most=MOST_UNFINISHED) if not r.done]


async def new_runs(
    store: RunIndex, thread: str, seen: set[str], *, watch: int, most: int
) -> list[RunRecord]:
    """Runs of the thread not in ``seen``, oldest first; ``seen`` becomes the ids read.

    Reads the ``watch`` newest ids, more while every one of them is new (many runs came
    at once), up to ``most``; then the records of the new ones alone.
    """
    window = watch
    while True:
        ids = await store.run_ids(thread, 0, window)
        fresh = [run_id for run_id in ids if run_id not in seen]
        if len(fresh) < window or window >= most:
            break
        window = min(window * 4, most)
    # Older ids never come back into the newest: forgetting them keeps ``seen`` small.
    seen.clear()
    seen.update(ids)
    fresh.reverse()
    records = await store.run_records(fresh)
    return [record for record in records if record is not None]
