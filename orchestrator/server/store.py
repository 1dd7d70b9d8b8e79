"""Thread and run records in Redis, shared by every orchestrator replica.

Why Redis and not tables next to the checkpoints: every replica already shares it (it is
the broker), it gives the cross-replica channel for free (pub/sub for cancels, streams for
the event relay, see :mod:`orchestrator.server.eventlog`), and it works the same whether
the checkpointer is SQLite (one replica) or Postgres (many). These records are the
*operational* side of a run (status, owner, queue position); the conversation itself is in
the checkpointer. Every record expires: a run's ``TOOLFLEET_RUN_TTL`` seconds after it was
created and again after it finished, a thread's (with its index entries and its list of
runs) ``TOOLFLEET_THREAD_TTL`` seconds after its last change. Index entries whose record
has expired are dropped as searches meet them.

Threads are stored under their thread key ``<tenant>/<thread id>``
(:mod:`orchestrator.server.tenancy`); each tenant has its own index of threads, so a
search never reads another tenant's.

One run at a time holds a thread, and the others wait in line: see
:mod:`orchestrator.server.threadline`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis

from orchestrator.server.encoding import dumps, loads
from orchestrator.server.guards import runlist
from orchestrator.server.guards.account import (
    TenantAccount,
    run_field,
    size_of,
    state_field,
    thread_field,
)
from orchestrator.server.keys import Keys
from orchestrator.server.records import RunRecord, ThreadRecord, now_iso
from orchestrator.server.tenancy import split_thread_key, thread_key
from orchestrator.server.threadline import ThreadLine

_CREATE_THREAD = """
-- KEYS: thread hash, the tenant's thread indexes (by creation, by update).
-- ARGV: thread id, score, ttl, field/values.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[3])
for i = 2, 3 do
    redis.call('ZADD', KEYS[i], ARGV[2], ARGV[1])
    redis.call('EXPIRE', KEYS[i], ARGV[3])
end
return 1
"""

_INDEXED = ("created_at", "updated_at")
"""Thread orders read from an index; the others sort the tenant's matching threads."""


class Store(ThreadLine):
    """Thread and run records, and the thread lock and queue (:class:`ThreadLine`).

    Args:
        client: A ``redis.asyncio`` client created with ``decode_responses=True``.
        keys: Key names of the deployment.
        run_ttl: Seconds a run's record is kept after it was created, and after it finished.
        thread_ttl: Seconds a thread's records are kept after its last change.
        quota: Counts each tenant's thread and run records against its storage quota
            (``None``: nothing is counted).
    """

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        run_ttl: int,
        thread_ttl: int,
        quota: TenantAccount | None = None,
    ) -> None:
        self._r: Any = client  # redis-py's stubs type replies as bytes | str
        self._keys = keys
        self.quota = quota
        self._run_ttl = run_ttl
        self._thread_ttl = thread_ttl
        self._create_thread = client.register_script(_CREATE_THREAD)
        self._register_line_scripts(client)

    # -- threads ----------------------------------------------------------------------------

    async def create_thread(
        self, tenant: str, thread_id: str, metadata: dict[str, Any]
    ) -> tuple[ThreadRecord, bool]:
        """Create the tenant's thread unless it exists; returns its record and whether it
        is new. The record and its index entry are written in one step, or not at all.

        Raises:
            QuotaExceeded: a new thread would take the tenant past its storage quota.
        """
        stamp = now_iso()
        record = ThreadRecord(
            thread_id, stamp, stamp, dict(metadata), tenant=tenant, state_updated_at=stamp
        )
        fields = _thread_fields(record)  # serialised first: nothing is written if it fails
        if self.quota is not None and not await self._r.exists(self._keys.thread(record.key)):
            await self.quota.charge(tenant, thread_field(thread_id), _record_size(fields))
        created = await self._create_thread(
            keys=[
                self._keys.thread(record.key),
                self._keys.threads(tenant),
                self._keys.threads_updated(tenant),
            ],
            args=[
                thread_id,
                time.time(),
                self._thread_ttl,
                *(x for pair in fields.items() for x in pair),
            ],
        )
        if created:
            return record, True
        existing = await self.thread(record.key)
        return (existing, False) if existing is not None else (record, False)

    async def thread(self, key: str) -> ThreadRecord | None:
        """The record of the thread with thread key ``key``, or ``None``."""
        raw = await self._r.hgetall(self._keys.thread(key))
        if not raw or "created_at" not in raw:
            return None
        tenant, thread_id = split_thread_key(key)
        return ThreadRecord(
            thread_id=thread_id,
            created_at=raw["created_at"],
            updated_at=raw["updated_at"],
            metadata=loads(raw.get("metadata") or "{}"),
            status=raw.get("status", "idle"),
            tenant=tenant,
            state_updated_at=raw.get("state_updated_at", raw["updated_at"]),
            config=loads(raw.get("config") or "{}"),
        )

    async def note_run(
        self, record: ThreadRecord, tags: dict[str, Any], config: dict[str, Any]
    ) -> None:
        """Add ``tags`` to the thread's metadata where it lacks them, and merge a run's
        ``config`` into the thread's (the run's keys win, ``configurable`` merged too)."""
        record.metadata.update({k: v for k, v in tags.items() if k not in record.metadata})
        configurable = {**record.config.get("configurable", {}), **config.get("configurable", {})}
        record.config = {**record.config, **config, "configurable": configurable}
        fields = {
            "metadata": dumps(record.metadata).decode(),
            "config": dumps(record.config).decode(),
        }
        await self._charge_thread(record)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.thread(record.key), mapping=fields)
            self._touch(pipe, record.key)
            await pipe.execute()

    async def merge_thread_metadata(self, record: ThreadRecord, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the thread's (its keys win) and restart its expiry."""
        record.metadata.update(metadata)
        record.updated_at = now_iso()
        fields = {"metadata": dumps(record.metadata).decode(), "updated_at": record.updated_at}
        await self._charge_thread(record)
        key = self._keys.thread(record.key)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.exists(key)
            pipe.hset(key, mapping=fields)
            self._touch(pipe, record.key, updated=True)
            exists, *_ = await pipe.execute()
        if not exists:  # deleted meanwhile: do not leave a half record behind
            await self._r.delete(key)

    async def set_thread_status(self, thread: str, status: str) -> None:
        """Record the status of the thread with key ``thread`` (if it still exists)."""
        key = self._keys.thread(thread)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.exists(key)
            stamp = now_iso()
            pipe.hset(
                key, mapping={"status": status, "updated_at": stamp, "state_updated_at": stamp}
            )
            self._touch(pipe, thread, updated=True)
            exists, *_ = await pipe.execute()
        if not exists:  # deleted meanwhile: do not leave a half record behind
            await self._r.delete(key)

    async def delete_thread(self, thread: str, *, keep_runs: bool = False) -> None:
        """Drop the record of the thread with key ``thread`` and (unless ``keep_runs``)
        its runs' records and logs.

        A run without a thread keeps its record and event log until they expire, so a
        client still streaming it reads to the end.
        """
        tenant, thread_id = split_thread_key(thread)
        run_ids = await self._r.zrange(self._keys.thread_runs(thread), 0, -1)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.thread(thread), self._keys.thread_runs(thread))
            pipe.zrem(self._keys.threads(tenant), thread_id)
            pipe.zrem(self._keys.threads_updated(tenant), thread_id)
            for run_id in [] if keep_runs else run_ids:
                pipe.delete(self._keys.run(run_id), self._keys.events(run_id))
            await pipe.execute()
        if self.quota is not None:
            runs = [] if keep_runs else [run_field(r) for r in run_ids]
            await self.quota.release(tenant, thread_field(thread_id), state_field(thread_id), *runs)

    async def _charge_thread(self, record: ThreadRecord) -> None:
        """Count the thread's record as it is about to be written.

        Raises:
            QuotaExceeded: it grows past the tenant's storage quota.
        """
        if self.quota is not None:
            size = _record_size(_thread_fields(record))
            await self.quota.charge(record.tenant, thread_field(record.thread_id), size)

    async def search_threads(
        self,
        tenant: str,
        *,
        limit: int,
        offset: int,
        metadata: dict[str, Any] | None = None,
        status: str | None = None,
        ids: list[str] | None = None,
        sort_by: str = "updated_at",
        descending: bool = True,
    ) -> list[ThreadRecord]:
        """The tenant's threads filtered by metadata subset, status and ids, ordered by
        ``sort_by`` (most recent first by default)."""

        def wanted(record: ThreadRecord) -> bool:
            if status and record.status != status:
                return False
            return not metadata or all(record.metadata.get(k) == v for k, v in metadata.items())

        if ids is None and sort_by in _INDEXED:
            return await self._search_index(tenant, sort_by, descending, wanted, limit, offset)
        if ids is None:
            ids = list(await self._r.zrange(self._keys.threads(tenant), 0, -1))
        found = [r for r in await self._threads(tenant, ids) if wanted(r)]
        found.sort(key=lambda r: str(getattr(r, sort_by)), reverse=descending)
        return found[offset : offset + limit]

    async def _search_index(
        self,
        tenant: str,
        sort_by: str,
        descending: bool,
        wanted: Callable[[ThreadRecord], bool],
        limit: int,
        offset: int,
    ) -> list[ThreadRecord]:
        """Matching threads, read page by page in the order of the index of ``sort_by``."""
        index = (
            self._keys.threads(tenant) if sort_by == "created_at" else await self._updated(tenant)
        )
        read = self._r.zrevrange if descending else self._r.zrange
        found: list[ThreadRecord] = []
        skipped = position = 0
        while len(found) < limit:
            page = await read(index, position, position + 199)
            if not page:
                break
            records = await self._threads(tenant, page)
            position += len(records)  # the entries of expired records left the index
            for record in records:
                if not wanted(record):
                    continue
                if skipped < offset:
                    skipped += 1
                    continue
                found.append(record)
                if len(found) >= limit:
                    break
        return found

    async def _threads(self, tenant: str, ids: list[str]) -> list[ThreadRecord]:
        """The records of the tenant's threads ``ids`` that exist, in that order; index
        entries of records that expired are dropped."""
        records = [await self.thread(thread_key(tenant, thread_id)) for thread_id in ids]
        gone = [t for t, r in zip(ids, records, strict=True) if r is None]
        if gone:
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.zrem(self._keys.threads(tenant), *gone)
                pipe.zrem(self._keys.threads_updated(tenant), *gone)
                await pipe.execute()
        return [r for r in records if r is not None]

    async def _updated(self, tenant: str) -> str:
        """The index by update time, with any thread the index by creation has and it
        lacks (a thread written before it existed) added at its ``updated_at``."""
        index = self._keys.threads_updated(tenant)
        created = self._keys.threads(tenant)
        if await self._r.zcard(index) >= await self._r.zcard(created):
            return index
        known = set(await self._r.zrange(index, 0, -1))
        missing = [t for t in await self._r.zrange(created, 0, -1) if t not in known]
        for record in await self._threads(tenant, missing):
            stamp = datetime.fromisoformat(record.updated_at).timestamp()
            await self._r.zadd(index, {record.thread_id: stamp})
        return index

    # -- runs ---------------------------------------------------------------------------------

    async def put_run(self, run: RunRecord) -> None:
        """Store a new run and list it under its thread.

        Raises:
            QuotaExceeded: its record would take the tenant past its storage quota.
        """
        fields = _run_fields(run)
        if self.quota is not None:
            await self.quota.charge(run.tenant, run_field(run.run_id), _record_size(fields))
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.run(run.run_id), mapping=fields)
            pipe.expire(self._keys.run(run.run_id), self._run_ttl)
            pipe.zadd(self._keys.thread_runs(run.thread_key), {run.run_id: time.time()})
            self._touch(pipe, run.thread_key)
            await pipe.execute()

    async def run(self, run_id: str) -> RunRecord | None:
        """The run's record, or ``None``."""
        raw = await self._r.hgetall(self._keys.run(run_id))
        return _run_from(raw) if raw and "doc" in raw else None

    async def runs(
        self, thread: str, *, limit: int, offset: int, status: str | None = None
    ) -> list[RunRecord]:
        """The runs of the thread with key ``thread``, newest first: one page, read by
        :func:`orchestrator.server.guards.runlist.runs_page`."""
        return await runlist.runs_page(self, thread, limit=limit, offset=offset, status=status)

    async def run_ids(self, thread: str, start: int, count: int) -> list[str]:
        """Ids of the thread's runs at positions ``start`` to ``start + count - 1``, the
        newest at 0: one read, whatever the length of the thread's history."""
        if count <= 0:
            return []
        ids: list[str] = await self._r.zrevrange(
            self._keys.thread_runs(thread), start, start + count - 1
        )
        return ids

    async def newest_run_ids(self, thread: str, count: int) -> list[str]:
        """Ids of the ``count`` newest runs of the thread with key ``thread``, newest
        first: one read, whatever the length of the thread's history."""
        return await self.run_ids(thread, 0, count)

    async def run_records(self, run_ids: list[str]) -> list[RunRecord | None]:
        """The records of these runs, in that order (``None``: expired): one round trip."""
        if not run_ids:
            return []
        async with self._r.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hgetall(self._keys.run(run_id))
            raws = await pipe.execute()
        return [_run_from(raw) if raw and "doc" in raw else None for raw in raws]

    async def runs_by_id(self, run_ids: list[str]) -> list[RunRecord]:
        """The records of these runs that exist, in that order: one round trip."""
        return [record for record in await self.run_records(run_ids) if record is not None]

    async def forget_run_ids(self, thread: str, run_ids: list[str]) -> None:
        """Drop these ids (of runs whose records expired) from the thread's runs."""
        if run_ids:
            await self._r.zrem(self._keys.thread_runs(thread), *run_ids)

    async def set_run_status(
        self, run_id: str, status: str, error: dict[str, Any] | None = None
    ) -> None:
        """Record the run's status; a finished run's record starts to expire."""
        fields = {"status": status, "updated_at": now_iso()}
        if error is not None:
            fields["error"] = dumps(error).decode()
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.run(run_id), mapping=fields)
            pipe.expire(self._keys.run(run_id), self._run_ttl)
            await pipe.execute()

    async def set_run_attempt(self, run_id: str, replica: str, attempt: int) -> None:
        """Record that ``replica`` executes the run now, as its attempt ``attempt``."""
        fields = {"replica": replica, "attempt": str(attempt), "updated_at": now_iso()}
        await self._r.hset(self._keys.run(run_id), mapping=fields)

    async def request_cancel(
        self, run_id: str, action: str = "interrupt", reason: str | None = None
    ) -> None:
        """Flag the run as to be cancelled (its owner checks the flag as it renews), with
        what to do then: ``interrupt`` or ``rollback``, and why (its webhook says it)."""
        fields = {"cancel": action, **({"cancel_reason": reason} if reason else {})}
        await self._r.hset(self._keys.run(run_id), mapping=fields)

    async def cancel_reason(self, run_id: str) -> str | None:
        """Why the run was cancelled, as its cancel request said (``None``: not said)."""
        reason: str | None = await self._r.hget(self._keys.run(run_id), "cancel_reason")
        return reason

    async def cancel_requested(self, run_id: str) -> bool:
        """Whether someone asked to cancel the run."""
        return await self.cancel_action(run_id) is not None

    async def cancel_action(self, run_id: str) -> str | None:
        """What a cancel request asked for (``None``: there is none)."""
        action: str | None = await self._r.hget(self._keys.run(run_id), "cancel")
        return action

    async def delete_run(self, run: RunRecord) -> None:
        """Forget a finished run."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.run(run.run_id), self._keys.events(run.run_id))
            pipe.zrem(self._keys.thread_runs(run.thread_key), run.run_id)
            await pipe.execute()
        if self.quota is not None:
            await self.quota.release(run.tenant, run_field(run.run_id))

    def _touch(self, pipe: Any, thread: str, *, updated: bool = False) -> None:
        """Restart the expiry of the thread's records: it changed (``updated``: its
        ``updated_at`` too, so it moves up the index by update time)."""
        tenant, thread_id = split_thread_key(thread)
        if updated:
            pipe.zadd(self._keys.threads_updated(tenant), {thread_id: time.time()})
        for key in (
            self._keys.thread(thread),
            self._keys.thread_runs(thread),
            self._keys.threads(tenant),
            self._keys.threads_updated(tenant),
        ):
            pipe.expire(key, self._thread_ttl)


def _record_size(fields: dict[str, str]) -> int:
    """Bytes a record's fields take (names and values; Redis's overhead aside)."""
    return size_of(*fields.keys(), *fields.values())


def _thread_fields(record: ThreadRecord) -> dict[str, str]:
    return {
        "thread_id": record.thread_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "state_updated_at": record.state_updated_at or record.updated_at,
        "metadata": dumps(record.metadata).decode(),
        "status": record.status,
        "config": dumps(record.config).decode(),
    }


def _run_fields(run: RunRecord) -> dict[str, str]:
    doc = {
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "tenant": run.tenant,
        "assistant_id": run.assistant_id,
        "created_at": run.created_at,
        "metadata": run.metadata,
        "multitask_strategy": run.multitask_strategy,
        "kwargs": run.kwargs,
        "temporary": run.temporary,
    }
    return {
        "doc": dumps(doc).decode(),
        "status": run.status,
        "updated_at": run.updated_at,
        "replica": run.replica,
        "attempt": str(run.attempt),
    }


def _run_from(raw: dict[str, str]) -> RunRecord:
    doc = loads(raw["doc"])
    return RunRecord(
        run_id=doc["run_id"],
        thread_id=doc["thread_id"],
        assistant_id=doc["assistant_id"],
        created_at=doc["created_at"],
        updated_at=raw.get("updated_at", doc["created_at"]),
        status=raw.get("status", "pending"),
        replica=raw.get("replica", ""),
        metadata=doc.get("metadata") or {},
        multitask_strategy=doc.get("multitask_strategy", "enqueue"),
        kwargs=doc.get("kwargs") or {},
        error=loads(raw["error"]) if raw.get("error") else None,
        cancel_requested=bool(raw.get("cancel")),
        tenant=doc.get("tenant", ""),
        attempt=int(raw.get("attempt") or 1),
        temporary=bool(doc.get("temporary")),
    )
