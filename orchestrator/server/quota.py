"""Storage quotas: moved to :mod:`orchestrator.server.guards.account`, the tenant's
account; these names stay importable from here."""

from __future__ import annotations

from orchestrator.server.guards.account import (
    RECOUNT_PAGE,
    TOTAL,
    QuotaExceeded,
    StorageQuota,
    TenantAccount,
    assistant_field,
    cron_field,
    item_field,
    run_field,
    size_of,
    state_field,
    thread_field,
)

__all__ = [
    "RECOUNT_PAGE",
    "TOTAL",
    "QuotaExceeded",
    "StorageQuota",
    "TenantAccount",
    "assistant_field",
    "cron_field",
    "item_field",
    "run_field",
    "size_of",
    "state_field",
    "thread_field",
]
