"""Crons: their records, each tenant's own, and the run request each tick makes.

A cron is a run request and a schedule (a cron expression, five fields, or six with
seconds last, as LangGraph's server reads it with croniter; in a timezone, UTC unless
given). Its record is the protocol's ``Cron``, kept in Redis under the tenant::

    server:cron:<tenant>/<cron id>        string the cron's document (JSON)
    server:crons:<tenant>                 zset   the tenant's cron ids by creation time
    server:cron-fired:<tenant>/<cron id>  string the time of its last tick that fired

Crons are kept as the tenant's other records are, by its account
(:mod:`orchestrator.server.guards.account`): each counts its bytes towards
``TOOLFLEET_TENANT_MAX_BYTES`` and one towards ``TOOLFLEET_TENANT_MAX_CRONS``, and its
keys expire the account's retention (``TOOLFLEET_THREAD_TTL``) after its last change or
tick, plus the wait for its next tick (a cron that keeps firing is kept). A schedule
whose ticks ever come closer than ``TOOLFLEET_CRON_MIN_INTERVAL`` is refused. When it
fires is :mod:`orchestrator.server.cronbeat`'s business.
"""

from __future__ import annotations

import functools
import itertools
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import redis.asyncio as aioredis
from croniter import CroniterBadDateError, croniter

from orchestrator.server.encoding import dumps, loads
from orchestrator.server.errors import Unsupported
from orchestrator.server.guards.account import TenantAccount, cron_field, size_of
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


DAY = 86_400

LEAP_CYCLE_DAYS = 4 * 366
"""Days looked at for two consecutive matching days (every date, the 29th of February
included)."""

STOPPED_REASON = "stopped_reason"
STOPPED_AT = "stopped_at"
"""Metadata fields of a cron stopped by the service: why (``assistant_not_found``,
``thread_not_found``, ``schedule_too_frequent``) and when."""


@functools.lru_cache(maxsize=1024)
def shortest_gap(schedule: str) -> int | None:
    """The fewest seconds between two consecutive ticks of ``schedule`` under a day, on
    the schedule's clock (``None``: none come within a day of each other).

    A schedule ticks at the same times of every day it matches: the gaps are those
    between its times of day, and, across midnight, from its last time to its first
    when two consecutive days match.
    """
    fields = croniter(schedule).expanded
    seconds = fields[5] if len(fields) > 5 else [0]
    times = sorted(
        {
            h * 3600 + m * 60 + sec
            for h in _values(fields[1], 0, 23)
            for m in _values(fields[0], 0, 59)
            for sec in _values(seconds, 0, 59)
        }
    )
    gaps = [b - a for a, b in itertools.pairwise(times)]
    overnight = DAY - times[-1] + times[0]
    if (not gaps or overnight < min(gaps)) and _consecutive_days(schedule):
        gaps.append(overnight)
    shortest = min(gaps, default=DAY)
    return shortest if shortest < DAY else None


def _values(field: list[Any], low: int, high: int) -> list[int]:
    return list(range(low, high + 1)) if field == ["*"] else [int(v) for v in field]


def _consecutive_days(schedule: str) -> bool:
    """Whether two consecutive days ever both match ``schedule``'s day fields."""
    days = " ".join(schedule.split()[2:5])
    ticks = croniter(f"0 0 {days}", datetime(2024, 1, 1, tzinfo=UTC))
    last: datetime | None = None
    for _ in range(LEAP_CYCLE_DAYS):
        try:
            day: datetime = ticks.get_next(datetime)
        except CroniterBadDateError:
            return False
        if last is not None and day - last == timedelta(days=1):
            return True
        if day.year >= 2028:
            return False
        last = day
    return False


def check_interval(schedule: str, min_interval: int) -> None:
    """Refuse a schedule whose ticks ever come less than ``min_interval`` seconds apart.

    Raises:
        Unsupported: they do (422), naming the schedule and the limit.
    """
    gap = shortest_gap(schedule)
    if gap is not None and gap < min_interval:
        raise Unsupported(
            f"schedule {schedule[:64]!r} ticks {gap:g} s apart; crons tick at most every "
            f"{min_interval} s (TOOLFLEET_CRON_MIN_INTERVAL)"
        )


_WRITE = """
-- KEYS: the cron's document, the tenant's index, its last fired tick.
-- ARGV: document, cron id, score (0: keep the index's), ttl.
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[4])
if ARGV[3] ~= '0' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]) end
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('EXPIRE', KEYS[3], ARGV[4]) end
return 1
"""

_CLAIM = """
-- KEYS: the cron's last fired tick. ARGV: this tick (UNIX seconds), ttl.
-- Returns 1 (claimed: no later or equal tick fired before) or 0.
local last = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


class CronStore:
    """The tenants' crons in Redis, counted and kept by the tenants' account.

    Args:
        client: A ``redis.asyncio`` client created with ``decode_responses=True``.
        keys: Key names of the deployment.
        account: The tenants' account: crons count there, and live its retention.
        min_interval: Fewest seconds between two ticks of a schedule.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        account: TenantAccount,
        min_interval: int = 60,
    ) -> None:
        self._r: Any = client
        self._keys = keys
        self.account = account
        self.min_interval = min_interval
        self._write = client.register_script(_WRITE)
        self._claim = client.register_script(_CLAIM)

    def check(self, doc: dict[str, Any]) -> None:
        """Refuse the cron's schedule if it ticks too often (422)."""
        check_interval(doc["schedule"], self.min_interval)

    def ttl(self, doc: dict[str, Any], now: datetime | None = None) -> int:
        """Seconds the cron is kept from now: the retention, after its next tick if it
        has one (a cron that keeps firing is kept)."""
        keep = self.account.retention
        if doc.get("enabled", True):
            now = now or datetime.now(UTC)
            upcoming = to_api(doc, now)["next_run_date"]
            if upcoming is not None:
                keep += max(0, int((datetime.fromisoformat(upcoming) - now).total_seconds()))
        return keep

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
        """Store a new cron of the tenant; returns its document.

        Raises:
            Unsupported: its schedule ticks too often.
            QuotaExceeded: it would take the tenant past its storage quota or its cap
                of crons.
        """
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
        self.check(doc)
        await self._save(tenant, doc, score=time.time())
        return doc

    async def get(self, tenant: str, cron_id: str) -> dict[str, Any] | None:
        """The tenant's cron, or ``None``."""
        raw = await self._r.get(self._keys.cron(cron_key(tenant, cron_id)))
        return loads(raw) if raw else None

    async def put(self, tenant: str, doc: dict[str, Any]) -> None:
        """Write back a changed cron (its expiry starts again).

        Raises:
            Unsupported: its schedule ticks too often.
            QuotaExceeded: it grew past the tenant's storage quota.
        """
        self.check(doc)
        doc["updated_at"] = now_iso()
        await self._save(tenant, doc)

    async def touch(self, tenant: str, doc: dict[str, Any]) -> None:
        """Keep the cron as from now: one of its ticks fired."""
        await self._save(tenant, doc)

    async def stop(self, tenant: str, doc: dict[str, Any], reason: str) -> None:
        """Disable the cron, saying why in its metadata (``stopped_reason``)."""
        doc["enabled"] = False
        doc["metadata"] = {**(doc.get("metadata") or {}), STOPPED_REASON: reason}
        doc["metadata"][STOPPED_AT] = now_iso()
        doc["updated_at"] = now_iso()
        await self._save(tenant, doc)

    async def claim(self, tenant: str, doc: dict[str, Any], tick: datetime) -> bool:
        """Claim the cron's tick at ``tick``: whether no scheduler fired it, or a later
        one, before (one key per cron, never one per tick)."""
        key = self._keys.cron_fired(cron_key(tenant, doc["cron_id"]))
        done = await self._claim(keys=[key], args=[f"{tick.timestamp():.0f}", self.ttl(doc)])
        return bool(done)

    async def delete(self, tenant: str, cron_id: str) -> bool:
        """Delete the tenant's cron; whether it existed."""
        key = cron_key(tenant, cron_id)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.cron(key))
            pipe.zrem(self._keys.crons(tenant), cron_id)
            pipe.delete(self._keys.cron_fired(key))
            deleted, *_ = await pipe.execute()
        await self.account.release(tenant, cron_field(cron_id))
        return bool(deleted)

    async def all(self, tenant: str) -> list[dict[str, Any]]:
        """Every cron of the tenant, oldest first (index entries of expired crons are
        dropped as they are met)."""
        index = self._keys.crons(tenant)
        ids = await self._r.zrange(index, 0, -1)
        if not ids:
            return []
        raws = await self._r.mget([self._keys.cron(cron_key(tenant, i)) for i in ids])
        gone = [i for i, raw in zip(ids, raws, strict=True) if not raw]
        if gone:
            await self._r.zrem(index, *gone)
        return [loads(raw) for raw in raws if raw]

    async def _save(self, tenant: str, doc: dict[str, Any], score: float = 0.0) -> None:
        """Count the cron in the account (refused past a limit: nothing is written),
        then write it with its expiry."""
        text = dumps(doc)
        ttl = self.ttl(doc)
        await self.account.charge(tenant, cron_field(doc["cron_id"]), size_of(text), ttl=ttl)
        key = cron_key(tenant, doc["cron_id"])
        await self._write(
            keys=[self._keys.cron(key), self._keys.crons(tenant), self._keys.cron_fired(key)],
            args=[text, doc["cron_id"], score, ttl],
        )


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
