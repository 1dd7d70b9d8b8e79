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

One run at a time holds a thread: ``thread-lock:<id>`` names it, with a TTL its owner
renews, so a replica that dies frees its threads. Runs that may wait for the thread
(multitask strategy ``enqueue`` or ``interrupt``) line up in ``thread-queue:<id>``; the
admission script lets the first in line in, skipping those whose replica is gone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from orchestrator.server.encoding import dumps, loads
from orchestrator.server.keys import Keys
from orchestrator.server.schemas import TERMINAL_STATUSES
from orchestrator.server.tenancy import split_thread_key, thread_key

LOCK_TTL_MS = 30_000
"""How long a thread stays held by a run whose replica stopped renewing it."""

_ADMIT = """
-- KEYS: lock, queue. ARGV: run id, ttl ms, alive-key prefix.
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if (not head) or head == ARGV[1] then break end
  if redis.call('EXISTS', ARGV[3] .. head) == 1 then return 0 end
  redis.call('LPOP', KEYS[2])  -- its replica stopped waiting: skip it
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if redis.call('LINDEX', KEYS[2], 0) == ARGV[1] then redis.call('LPOP', KEYS[2]) end
return 1
"""

_CREATE_THREAD = """
-- KEYS: thread hash, the tenant's thread index. ARGV: thread id, score, ttl, field/values.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""

_IF_HOLDER = """
-- KEYS: lock. ARGV: run id, 'release' | ttl ms.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == 'release' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


def now_iso() -> str:
    """The current time as ISO 8601 with the UTC offset."""
    return datetime.now(UTC).isoformat()


@dataclass
class ThreadRecord:
    """What the service knows of a thread besides its checkpoints."""

    thread_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str = "idle"
    tenant: str = ""

    @property
    def key(self) -> str:
        """The thread key: ``<tenant>/<thread id>``."""
        return thread_key(self.tenant, self.thread_id)

    def to_api(self, values: Any = None) -> dict[str, Any]:
        """The protocol's ``Thread``."""
        return {
            "thread_id": self.thread_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "metadata": self.metadata,
            "status": self.status,
            "values": values,
            "interrupts": {},
        }


@dataclass
class RunRecord:
    """What the service knows of a run."""

    run_id: str
    thread_id: str
    assistant_id: str
    created_at: str
    updated_at: str
    status: str
    replica: str
    metadata: dict[str, Any] = field(default_factory=dict)
    multitask_strategy: str = "reject"
    kwargs: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    tenant: str = ""

    @property
    def thread_key(self) -> str:
        """The key of the run's thread: ``<tenant>/<thread id>``."""
        return thread_key(self.tenant, self.thread_id)

    @property
    def done(self) -> bool:
        """Whether the run has finished (its status will not change again)."""
        return self.status in TERMINAL_STATUSES

    def to_api(self) -> dict[str, Any]:
        """The protocol's ``Run``, plus the owner replica and the error."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": self.multitask_strategy,
            "kwargs": self.kwargs,
            "replica": self.replica,
            "error": self.error,
        }


class Store:
    """Thread and run records, the thread lock and queue.

    Args:
        client: A ``redis.asyncio`` client created with ``decode_responses=True``.
        keys: Key names of the deployment.
        run_ttl: Seconds a run's record is kept after it was created, and after it finished.
        thread_ttl: Seconds a thread's records are kept after its last change.
    """

    def __init__(self, client: aioredis.Redis, keys: Keys, run_ttl: int, thread_ttl: int) -> None:
        self._r: Any = client  # redis-py's stubs type replies as bytes | str
        self._keys = keys
        self._run_ttl = run_ttl
        self._thread_ttl = thread_ttl
        self._admit = client.register_script(_ADMIT)
        self._create_thread = client.register_script(_CREATE_THREAD)
        self._if_holder = client.register_script(_IF_HOLDER)

    # -- threads ----------------------------------------------------------------------------

    async def create_thread(
        self, tenant: str, thread_id: str, metadata: dict[str, Any]
    ) -> tuple[ThreadRecord, bool]:
        """Create the tenant's thread unless it exists; returns its record and whether it
        is new. The record and its index entry are written in one step, or not at all."""
        stamp = now_iso()
        record = ThreadRecord(thread_id, stamp, stamp, dict(metadata), tenant=tenant)
        fields = _thread_fields(record)  # serialised first: nothing is written if it fails
        created = await self._create_thread(
            keys=[self._keys.thread(record.key), self._keys.threads(tenant)],
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
        )

    async def tag_thread(self, record: ThreadRecord, tags: dict[str, Any]) -> None:
        """Add ``tags`` to the thread's metadata where it lacks them."""
        missing = {k: v for k, v in tags.items() if k not in record.metadata}
        if missing:
            record.metadata.update(missing)
            metadata = dumps(record.metadata).decode()
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.hset(self._keys.thread(record.key), "metadata", metadata)
                self._touch(pipe, record.key)
                await pipe.execute()

    async def set_thread_status(self, thread: str, status: str) -> None:
        """Record the status of the thread with key ``thread`` (if it still exists)."""
        key = self._keys.thread(thread)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.exists(key)
            pipe.hset(key, mapping={"status": status, "updated_at": now_iso()})
            self._touch(pipe, thread)
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
            for run_id in [] if keep_runs else run_ids:
                pipe.delete(self._keys.run(run_id), self._keys.events(run_id))
            await pipe.execute()

    async def search_threads(
        self,
        tenant: str,
        *,
        limit: int,
        offset: int,
        metadata: dict[str, Any] | None = None,
        status: str | None = None,
        ids: list[str] | None = None,
    ) -> list[ThreadRecord]:
        """The tenant's threads newest first, filtered by metadata subset, status and ids."""
        found: list[ThreadRecord] = []
        skipped = 0
        candidates = ids if ids is not None else None
        position = 0
        while len(found) < limit:
            if candidates is None:
                index = self._keys.threads(tenant)
                page = await self._r.zrevrange(index, position, position + 199)
                position += 200
                if not page:
                    break
            else:
                page, candidates = candidates, []
                if not page:
                    break
            for thread_id in page:
                record = await self.thread(thread_key(tenant, thread_id))
                if record is None:
                    if candidates is None:  # an index entry whose record expired
                        await self._r.zrem(self._keys.threads(tenant), thread_id)
                        position -= 1
                    continue
                if status and record.status != status:
                    continue
                if metadata and any(record.metadata.get(k) != v for k, v in metadata.items()):
                    continue
                if skipped < offset:
                    skipped += 1
                    continue
                found.append(record)
                if len(found) >= limit:
                    break
        return found

    # -- runs ---------------------------------------------------------------------------------

    async def put_run(self, run: RunRecord) -> None:
        """Store a new run and list it under its thread."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.run(run.run_id), mapping=_run_fields(run))
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
        """The runs of the thread with key ``thread``, newest first."""
        ids = await self._r.zrevrange(self._keys.thread_runs(thread), 0, -1)
        found: list[RunRecord] = []
        for run_id in ids:
            run = await self.run(run_id)
            if run is None:  # expired
                await self._r.zrem(self._keys.thread_runs(thread), run_id)
                continue
            if status is None or run.status == status:
                found.append(run)
        return found[offset : offset + limit]

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

    async def request_cancel(self, run_id: str) -> None:
        """Flag the run as to be cancelled (its owner checks the flag as it renews)."""
        await self._r.hset(self._keys.run(run_id), "cancel", "1")

    async def cancel_requested(self, run_id: str) -> bool:
        """Whether someone asked to cancel the run."""
        return bool(await self._r.hget(self._keys.run(run_id), "cancel"))

    async def delete_run(self, run: RunRecord) -> None:
        """Forget a finished run."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.run(run.run_id), self._keys.events(run.run_id))
            pipe.zrem(self._keys.thread_runs(run.thread_key), run.run_id)
            await pipe.execute()

    # -- the thread lock and queue (by thread key) ----------------------------------------

    async def admit(self, thread_id: str, run_id: str) -> bool:
        """Let the run hold the thread if it is free and the run is first in line."""
        keys = self._keys
        return bool(
            await self._admit(
                keys=[keys.thread_lock(thread_id), keys.thread_queue(thread_id)],
                args=[run_id, LOCK_TTL_MS, keys.run_alive_prefix],
            )
        )

    async def enqueue(self, thread_id: str, run_id: str, *, first: bool = False) -> None:
        """Put the run in the thread's line (at its head for ``first``)."""
        keys = self._keys
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.set(keys.run_alive(run_id), "1", px=LOCK_TTL_MS)
            if first:
                pipe.lpush(keys.thread_queue(thread_id), run_id)
            else:
                pipe.rpush(keys.thread_queue(thread_id), run_id)
            pipe.expire(keys.thread_queue(thread_id), self._thread_ttl)
            await pipe.execute()

    async def still_waiting(self, run_id: str) -> None:
        """Renew the mark that the run's replica still waits to start it."""
        await self._r.set(self._keys.run_alive(run_id), "1", px=LOCK_TTL_MS)

    async def leave_queue(self, thread_id: str, run_id: str) -> None:
        """Take the run out of the thread's line."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.lrem(self._keys.thread_queue(thread_id), 0, run_id)
            pipe.delete(self._keys.run_alive(run_id))
            await pipe.execute()

    async def holder(self, thread_id: str) -> str | None:
        """Id of the run holding the thread."""
        result: str | None = await self._r.get(self._keys.thread_lock(thread_id))
        return result

    async def renew(self, thread_id: str, run_id: str) -> bool:
        """Extend the run's hold on the thread; ``False`` if it lost it."""
        lock = self._keys.thread_lock(thread_id)
        return bool(await self._if_holder(keys=[lock], args=[run_id, LOCK_TTL_MS]))

    async def release(self, thread_id: str, run_id: str) -> None:
        """Free the thread if the run holds it."""
        await self._if_holder(keys=[self._keys.thread_lock(thread_id)], args=[run_id, "release"])

    def _touch(self, pipe: Any, thread: str) -> None:
        """Restart the expiry of the thread's records: it changed."""
        tenant, _ = split_thread_key(thread)
        for key in (
            self._keys.thread(thread),
            self._keys.thread_runs(thread),
            self._keys.threads(tenant),
        ):
            pipe.expire(key, self._thread_ttl)


def _thread_fields(record: ThreadRecord) -> dict[str, str]:
    return {
        "thread_id": record.thread_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "metadata": dumps(record.metadata).decode(),
        "status": record.status,
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
    }
    return {
        "doc": dumps(doc).decode(),
        "status": run.status,
        "updated_at": run.updated_at,
        "replica": run.replica,
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
        multitask_strategy=doc.get("multitask_strategy", "reject"),
        kwargs=doc.get("kwargs") or {},
        error=loads(raw["error"]) if raw.get("error") else None,
        cancel_requested=bool(raw.get("cancel")),
        tenant=doc.get("tenant", ""),
    )
