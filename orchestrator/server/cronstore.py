"""Crons: their records, each tenant's own, and the run request each tick makes.

A cron is a run request and a schedule (a cron expression, five fields, or six with
seconds last, as LangGraph's server reads it with croniter; in a timezone, UTC unless
given). Its record is the protocol's ``Cron``, kept in Redis under the tenant::

    server:cron:<tenant>/<cron id>   string the cron's document (JSON)
    server:crons:<tenant>            zset   the tenant's cron ids by creation time

Unlike the service's other records, a cron's do not expire: a cron lives until it is
deleted (or its thread is: its ticks then fail and are logged). When it fires is
:mod:`orchestrator.server.cronbeat`'s business.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import redis.asyncio as aioredis
from croniter import CroniterBadDateError, croniter

from orchestrator.server.encoding import dumps, loads
from orchestrator.server.keys import Keys
from orchestrator.server.records import now_iso
from orchestrator.server.schemas import RunCreate

RUN_FIELDS = (
    "assistant_id",
    "input",
    "config",
    "context",
    "metadata",
    "interrupt_before",
    "interrupt_after",
    "webhook",
    "multitask_strategy",
    "stream_mode",
    "stream_subgraphs",
    "stream_resumable",
    "durability",
)
"""Fields of a cron's ``payload``: the run request each tick makes."""


def next_tick(schedule: str, after: datetime, timezone: str | None) -> datetime | None:
    """The first time ``schedule`` names after ``after``, in UTC (``None``: none ever,
    as for the 31st of February)."""
    base = after.astimezone(ZoneInfo(timezone)) if timezone else after.astimezone(UTC)
    try:
        found: datetime = croniter(schedule, base).get_next(datetime)
    except CroniterBadDateError:
        return None
    return found.astimezone(UTC)


def cron_key(tenant: str, cron_id: str) -> str:
    """The name of the tenant's cron: its record's and its schedule entry's."""
    return f"{tenant}/{cron_id}"


class CronStore:
    """The tenants' crons in Redis.

    Args:
        client: A ``redis.asyncio`` client created with ``decode_responses=True``.
        keys: Key names of the deployment.
    """

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._r: Any = client
        self._base = keys.base

    def _doc_key(self, key: str) -> str:
        return f"{self._base}cron:{key}"

    def _index(self, tenant: str) -> str:
        return f"{self._base}crons:{tenant}"

    async def create(
        self,
        tenant: str,
        *,
        assistant_id: str,
        thread_id: str | None,
        schedule: str,
        timezone: str | None,
        end_time: str | None,
        enabled: bool,
        on_run_completed: str | None,
        payload: dict[str, Any],
        metadata: dict[str, Any],
    ) -> dict[str, Any]:
        """Store a new cron of the tenant; returns its document."""
        cron_id = str(uuid.uuid4())
        stamp = now_iso()
        payload = {**payload, "assistant_id": assistant_id}
        config = dict(payload.get("config") or {})
        config["configurable"] = {**(config.get("configurable") or {}), "cron_id": cron_id}
        payload["config"] = config
        doc = {
            "cron_id": cron_id,
            "assistant_id": assistant_id,
            "thread_id": thread_id,
            "on_run_completed": on_run_completed,
            "end_time": end_time,
            "schedule": schedule,
            "timezone": timezone,
            "created_at": stamp,
            "updated_at": stamp,
            "user_id": "",  # as LangGraph's server without custom auth
            "payload": payload,
            "metadata": metadata,
            "enabled": enabled,
        }
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.set(self._doc_key(cron_key(tenant, cron_id)), dumps(doc))
            pipe.zadd(self._index(tenant), {cron_id: time.time()})
            await pipe.execute()
        return doc

    async def get(self, tenant: str, cron_id: str) -> dict[str, Any] | None:
        """The tenant's cron, or ``None``."""
        raw = await self._r.get(self._doc_key(cron_key(tenant, cron_id)))
        return loads(raw) if raw else None

    async def put(self, tenant: str, doc: dict[str, Any]) -> None:
        """Write back a changed cron."""
        doc["updated_at"] = now_iso()
        await self._r.set(self._doc_key(cron_key(tenant, doc["cron_id"])), dumps(doc))

    async def delete(self, tenant: str, cron_id: str) -> bool:
        """Delete the tenant's cron; whether it existed."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._doc_key(cron_key(tenant, cron_id)))
            pipe.zrem(self._index(tenant), cron_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    async def all(self, tenant: str) -> list[dict[str, Any]]:
        """Every cron of the tenant, oldest first."""
        ids = await self._r.zrange(self._index(tenant), 0, -1)
        if not ids:
            return []
        raws = await self._r.mget([self._doc_key(cron_key(tenant, i)) for i in ids])
        return [loads(raw) for raw in raws if raw]


def to_api(doc: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The protocol's ``Cron`` of a stored document: with its ``next_run_date``."""
    upcoming = next_tick(doc["schedule"], now or datetime.now(UTC), doc.get("timezone"))
    end = doc.get("end_time")
    if end is not None and upcoming is not None and upcoming > datetime.fromisoformat(end):
        upcoming = None
    return {**doc, "next_run_date": upcoming.isoformat() if upcoming else None}


def run_request(doc: dict[str, Any]) -> RunCreate:
    """The run a tick of the cron starts: its payload, the cron's metadata beneath the
    payload's, and (a cron without a thread) its thread kept or deleted as it says."""
    payload = dict(doc["payload"])
    payload["metadata"] = {**(doc.get("metadata") or {}), **(payload.get("metadata") or {})}
    if doc.get("thread_id") is None:
        payload["on_completion"] = doc.get("on_run_completed") or "delete"
    return RunCreate.model_validate(payload)
