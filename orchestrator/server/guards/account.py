"""The tenant's account: the bytes and counts of what it keeps through the API, bounded.

Everything a tenant writes through the API and the service keeps is counted here, against
``TOOLFLEET_TENANT_MAX_BYTES``: thread records (metadata and the runs' merged config),
state values written with ``threads.update_state`` (and copied with a thread), run
requests (input, command, config, ... as kept in the run record), store items,
assistants and the versions kept of them, and crons (their record: schedule and run
request). Crons are counted too, against ``TOOLFLEET_TENANT_MAX_CRONS``. A write that
would take the tenant past either is refused with 413, naming the setting; a write that
does not grow an item always goes through (so a tenant at its quota can still shrink and
delete).

In Redis, one hash per tenant (``server:usage:<tenant>``): the bytes of each counted
item, by a field naming it (``t:<thread id>``, ``s:<thread id>``, ``r:<run id>``,
``a:<assistant id>``, ``c:<cron id>``, ``i:<hash of a store item's namespace and key>``),
their sum (``_total``) and the count of each capped kind (``#c``), changed together by
one script. It expires ``retention`` (``TOOLFLEET_THREAD_TTL``) after the tenant's last
counted write, and never before an item counted in it (a write may keep it longer).

Threads, runs, assistants and crons expire on their own (:attr:`TenantAccount.retention`
after their last use, the retention every store takes from here); their bytes stay
counted until a write of the tenant meets its quota or cap, which first recounts: items
whose record is gone are dropped. Store items count until they are deleted through the
API.

What is not counted: the checkpoints a run's graph writes (the conversation itself, in
the checkpointer) and the run's event log (kept ``TOOLFLEET_RUN_TTL``); both grow with
the runs a tenant makes, which the run limits bound.
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis.asyncio as aioredis

from orchestrator.server.errors import RequestRefused
from orchestrator.server.keys import Keys
from orchestrator.server.tenancy import thread_key

_CHARGE = """
-- KEYS: the tenant's usage hash.
-- ARGV: field, bytes, quota, ttl, mode ('set' or 'add'), count field ('' if none), cap.
-- Returns {1, total} (charged), {0, total} (refused: over the quota) or {2, count}
-- (refused: a new item past the cap of its kind).
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local total = tonumber(redis.call('HGET', KEYS[1], '_total') or '0')
local new = tonumber(ARGV[2])
if ARGV[5] == 'add' then new = old + new end
local after = total - old + new
if new > old and after > tonumber(ARGV[3]) then return {0, total} end
local counted = ARGV[6] ~= '' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
if counted and new > 0 then
    local n = tonumber(redis.call('HGET', KEYS[1], ARGV[6]) or '0')
    if n >= tonumber(ARGV[7]) then return {2, n} end
    redis.call('HSET', KEYS[1], ARGV[6], n + 1)
end
if new > 0 then
    redis.call('HSET', KEYS[1], ARGV[1], new)
else
    redis.call('HDEL', KEYS[1], ARGV[1])
end
if after < 0 then after = 0 end
redis.call('HSET', KEYS[1], '_total', after)
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[4]) then
    redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return {1, after}
"""

_DROP = """
-- KEYS: the tenant's usage hash. ARGV: fields to drop.
-- Recounts the total and each kind's count ('#' and the kind). Returns the new total.
if #ARGV > 0 then redis.call('HDEL', KEYS[1], unpack(ARGV)) end
local total = 0
local counts = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
    local name = all[i]
    local first = string.sub(name, 1, 1)
    if first == '#' then
        counts[name] = counts[name] or 0
    elseif name ~= '_total' then
        total = total + tonumber(all[i + 1])
        local kind = '#' .. string.sub(name, 1, 1)
        counts[kind] = (counts[kind] or 0) + 1
    end
end
for name, n in pairs(counts) do
    if string.sub(name, 1, 1) == '#' and redis.call('HEXISTS', KEYS[1], name) == 1 then
        redis.call('HSET', KEYS[1], name, n)
    end
end
if #all > 0 then redis.call('HSET', KEYS[1], '_total', total) end
return total
"""

TOTAL = "_total"

RECOUNT_PAGE = 500
"""Fields of the usage hash checked per round trip when a refusal recounts."""


class QuotaExceeded(RequestRefused):
    """Raised when a write would take a tenant past ``TOOLFLEET_TENANT_MAX_BYTES`` or
    past its cap of an item kind (``TOOLFLEET_TENANT_MAX_CRONS``)."""

    status_code = 413


def thread_field(thread_id: str) -> str:
    """The usage field of a thread's record."""
    return f"t:{thread_id}"


def state_field(thread_id: str) -> str:
    """The usage field of the state values written to a thread through the API."""
    return f"s:{thread_id}"


def run_field(run_id: str) -> str:
    """The usage field of a run's record."""
    return f"r:{run_id}"


def assistant_field(assistant_id: str) -> str:
    """The usage field of an assistant with its versions."""
    return f"a:{assistant_id}"


def cron_field(cron_id: str) -> str:
    """The usage field of a cron's record."""
    return f"c:{cron_id}"


def item_field(namespace: tuple[str, ...], key: str) -> str:
    """The usage field of a store item (a digest: namespaces and keys are long)."""
    digest = hashlib.sha256("\x1f".join((*namespace, key)).encode()).hexdigest()[:32]
    return f"i:{digest}"


CAPPED = {"c": ("crons", "TOOLFLEET_TENANT_MAX_CRONS")}
"""Kinds counted against a cap: their noun and the setting naming the cap."""


class TenantAccount:
    """Each tenant's bytes and counts kept through the API, and how long records live.

    Args:
        client: A ``redis.asyncio`` client created with ``decode_responses=True``.
        keys: Key names of the deployment.
        max_bytes: Bytes one tenant may keep.
        ttl: Seconds a tenant's records (and its usage) are kept after their last use:
            the retention every store of the tenant's records takes from here.
        max_crons: Crons one tenant may keep.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        max_bytes: int,
        ttl: int,
        max_crons: int = 100,
    ) -> None:
        self._r: Any = client
        self._keys = keys
        self.max_bytes = max_bytes
        self.retention = ttl
        """Seconds a tenant's threads, assistants and crons are kept after last use."""
        self.caps = {"c": max_crons}
        """Most items of each capped kind a tenant keeps."""
        self._charge = client.register_script(_CHARGE)
        self._drop = client.register_script(_DROP)
        self.seen: dict[str, int] = {}
        """Each tenant's total as this replica last wrote or read it (for ``/metrics``)."""

    async def charge(
        self, tenant: str, field: str, size: int, *, add: bool = False, ttl: int | None = None
    ) -> None:
        """Count ``size`` bytes for the tenant's item ``field`` (instead of its bytes so
        far; ``add``: on top of them); a new item of a capped kind counts one more.

        Args:
            ttl: Seconds the item is kept, when longer than the retention (the usage is
                then kept at least as long).

        Raises:
            QuotaExceeded: the item grows and the tenant's total would pass the quota,
                or it is new and its kind's count would pass its cap (even after
                dropping items that expired).
        """
        mode = "add" if add else "set"
        kind = field.partition(":")[0]
        cap = self.caps.get(kind)
        count = f"#{kind}" if cap is not None else ""
        keep = max(self.retention, ttl or 0)
        args: list[str | int] = [field, size, self.max_bytes, keep, mode, count, cap or 0]
        for attempt in range(2):
            done, found = await self._charge(keys=[self._key(tenant)], args=args)
            if done == 1:
                self._note(tenant, int(found))
                return
            if attempt == 0 and not await self._recount(tenant):
                break
        if done == 2:
            noun, setting = CAPPED[kind]
            raise QuotaExceeded(
                f"this tenant's cap of {noun} ({setting}, {cap}) would be exceeded: it "
                f"keeps {found} {noun}; delete {noun} first"
            )
        raise QuotaExceeded(
            f"this tenant's storage quota (TOOLFLEET_TENANT_MAX_BYTES, {self.max_bytes} bytes) "
            f"would be exceeded: it keeps {self.seen.get(tenant, 0)} bytes, and this write "
            f"needs {size} more for one item; delete threads, assistants, crons or store "
            "items first"
        )

    async def release(self, tenant: str, *fields: str) -> None:
        """Stop counting the tenant's items ``fields`` (deleted)."""
        if fields:
            total = await self._drop(keys=[self._key(tenant)], args=list(fields))
            self._note(tenant, int(total))

    async def size(self, tenant: str, field: str) -> int:
        """Bytes counted for the tenant's item ``field``."""
        found = await self._r.hget(self._key(tenant), field)
        return int(found or 0)

    async def usage(self, tenant: str) -> int:
        """The tenant's counted bytes."""
        total = int(await self._r.hget(self._key(tenant), TOTAL) or 0)
        self._note(tenant, total)
        return total

    async def _recount(self, tenant: str) -> bool:
        """Drop the items of the tenant whose record expired; whether any was."""
        key = self._key(tenant)
        gone: list[str] = []
        cursor = 0
        while True:
            cursor, page = await self._r.hscan(key, cursor, count=RECOUNT_PAGE)
            fields = [f for f in page if f != TOTAL and f[0] not in "#i"]
            if fields:
                async with self._r.pipeline(transaction=False) as pipe:
                    for field in fields:
                        pipe.exists(self._record_of(tenant, field))
                    found = await pipe.execute()
                gone += [f for f, there in zip(fields, found, strict=True) if not there]
            if not cursor:
                break
        total = await self._drop(keys=[key], args=gone)
        self._note(tenant, int(total))
        return bool(gone)

    def _record_of(self, tenant: str, field: str) -> str:
        """The Redis key whose presence says the counted item still exists."""
        kind, _, name = field.partition(":")
        if kind in ("t", "s"):
            return self._keys.thread(thread_key(tenant, name))
        if kind == "r":
            return self._keys.run(name)
        if kind == "c":
            return self._keys.cron(thread_key(tenant, name))
        return self._keys.assistant(thread_key(tenant, name))

    def _key(self, tenant: str) -> str:
        return self._keys.usage(tenant)

    def _note(self, tenant: str, total: int) -> None:
        if total > 0:
            self.seen[tenant] = total
        else:
            self.seen.pop(tenant, None)


StorageQuota = TenantAccount
"""The account's former name."""


def size_of(*parts: str | bytes) -> int:
    """Bytes of the serialised parts of a record (strings as UTF-8)."""
    return sum(len(p.encode() if isinstance(p, str) else p) for p in parts)
