"""Tenants: whose threads and runs are whose, and how many runs each may hold.

Every request is made by one tenant (:mod:`orchestrator.server.auth` names it from the
token; ``serve --no-auth`` has the one tenant ``anonymous``). A thread belongs to the
tenant that created it, and so do its runs, state, history and event logs: another
tenant asking for them gets 404, exactly as for an id that does not exist, and never
finds them in a search.

Thread ids are the client's, so two tenants may both have a thread ``t1``: each thread is
stored under its *thread key* ``<tenant>/<thread id>`` (a tenant id has no ``/``), which
names its Redis records, its thread lock and queue, and its checkpoints (the LangGraph
``thread_id`` the graph runs with). Clients only ever see their own thread id.

Per replica, a tenant executes at most ``TOOLFLEET_TENANT_MAX_RUNS`` runs at once (more
wait their turn, pending) and holds at most that many plus
``TOOLFLEET_TENANT_MAX_QUEUED`` (more are refused with 429). With both below
``TOOLFLEET_MAX_RUNS`` together, one tenant's load never fills the replica for another.

Runs are not what the workers are busy with: tool calls are. Per replica, a tenant's runs
have at most ``TOOLFLEET_TENANT_MAX_CALLS`` tool calls in flight, and all tenants' runs
``TOOLFLEET_MAX_CALLS``; further calls wait for their turn, tenant by tenant
(:mod:`orchestrator.fairshare`). Storage is bounded per tenant too
(:mod:`orchestrator.server.guards.account`).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

import redis.asyncio as aioredis

from orchestrator.fairshare import CallGate
from orchestrator.server.errors import AtCapacity
from orchestrator.server.keys import Keys
from tool_workers.contract.settings import Settings


def thread_key(tenant: str, thread_id: str) -> str:
    """The key of the tenant's thread ``thread_id``: its records' and checkpoints' id."""
    return f"{tenant}/{thread_id}"


def split_thread_key(key: str) -> tuple[str, str]:
    """The tenant and the client's thread id of a thread key."""
    tenant, _, thread_id = key.partition("/")
    return tenant, thread_id


async def tenant_key(client: aioredis.Redis, keys: Keys) -> bytes:
    """The deployment's key for tenant ids, made by the first replica that starts.

    Kept in Redis (the one server key that does not expire: a new key would give every
    bare token a new tenant, and its threads would be lost to it), so every replica
    hashes a token to the same id.
    """
    r: Any = client
    await r.set(keys.tenant_key, secrets.token_hex(32), nx=True)
    key: str | bytes = await r.get(keys.tenant_key)
    return key.encode() if isinstance(key, str) else key


class TenantQuota:
    """Each tenant's share of one replica's runs.

    Args:
        max_running: Runs of one tenant executing at once.
        max_queued: Runs of one tenant waiting to execute, beyond those.
    """

    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self._held: Counter[str] = Counter()
        self._slots: dict[str, asyncio.Semaphore] = {}

    def held(self, tenant: str) -> int:
        """Runs the tenant holds on this replica (executing, waiting or being created)."""
        return self._held[tenant]

    def take(self, tenant: str) -> None:
        """Count one more run of the tenant.

        Raises:
            AtCapacity: the tenant already holds its maximum of runs here.
        """
        if self._held[tenant] >= self.max_running + self.max_queued:
            raise AtCapacity(
                f"this tenant has {self._held[tenant]} runs on this replica (at most "
                f"{self.max_running} running and {self.max_queued} waiting); retry later"
            )
        self._held[tenant] += 1

    def give_back(self, tenant: str) -> None:
        """Count one run of the tenant less."""
        self._held[tenant] -= 1
        if self._held[tenant] <= 0:
            del self._held[tenant]

    def slot(self, tenant: str) -> asyncio.Semaphore:
        """What a run of the tenant holds while it executes."""
        found = self._slots.get(tenant)
        if found is None:
            found = self._slots[tenant] = asyncio.Semaphore(self.max_running)
        return found


def tenant_quota(settings: Settings) -> TenantQuota:
    """The per-tenant limits ``settings`` ask for (a quarter of the replica's each, unset)."""
    share = max(1, settings.max_runs // 4)
    running = settings.tenant_max_runs or share
    queued = share if settings.tenant_max_queued is None else settings.tenant_max_queued
    return TenantQuota(running, queued)


DEFAULT_TENANT_MAX_CALLS = 4
"""Tool calls of one tenant in flight per replica when ``TOOLFLEET_TENANT_MAX_CALLS`` is
unset: the compose file's tool worker slots (``TOOL_WORKER_CONCURRENCY``)."""


def call_gate(settings: Settings) -> CallGate:
    """The turns of tool calls ``settings`` ask for (per tenant: 4, at most ``max_calls``)."""
    per_tenant = settings.tenant_max_calls or DEFAULT_TENANT_MAX_CALLS
    return CallGate(min(per_tenant, settings.max_calls), settings.max_calls)
