"""What the registry says about the fleet: which live worker serves which tool where.

Read by orchestrators (to route), ``toolfleet status`` (to show the routing) and
workers (to hand on a call they do not serve). Each worker's entry is written by
:mod:`tool_workers.runtime.registry`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis

from tool_workers.contract.models import WorkerEntry
from tool_workers.contract.names import tool_queue, worker_registry_pattern

log = logging.getLogger("toolfleet.registry")

SCAN_COUNT = 10_000
"""Keys the server looks at per ``SCAN`` step: a read is one round trip per this many
keys in the database, whatever they are."""


def read_entries(client: redis.Redis, key_prefix: str) -> list[WorkerEntry]:
    """Every live worker's entry (unreadable entries are skipped with a warning)."""
    keys = list(client.scan_iter(match=worker_registry_pattern(key_prefix), count=SCAN_COUNT))
    if not keys:
        return []
    entries = []
    for raw in client.mget(keys):
        if raw is None:  # expired between SCAN and MGET
            continue
        try:
            entries.append(WorkerEntry.model_validate_json(raw))
        except ValueError as exc:
            log.warning("ignoring unreadable registry entry: %r", exc)
    return entries


def tool_queues_serving(entries: Iterable[WorkerEntry], tool: str) -> dict[str, list[str]]:
    """``{version: [worker, ...]}``: the versions of ``tool`` live workers serve on their
    tool queues (a worker from before routing by tool consumes none, and is left out)."""
    found: dict[str, list[str]] = {}
    for entry in entries:
        for spec in entry.tools:
            queue = tool_queue(spec.name, spec.version) if spec.name == tool else None
            if queue is not None and queue in entry.queues:
                found.setdefault(spec.version, []).append(entry.worker)
    return found
