"""The orchestrator's view of the tool registry the workers publish.

Each worker keeps one entry fresh (:mod:`tool_workers.runtime.registry` writes it); this side
reads every entry with one ``SCAN`` + ``MGET``, at most once a second, and shares the
resulting tool map between threads without copying it. Once a map has been read, a
caller never waits for the next read: a map older than a second is served while a
background thread reads the new one (each read is several round trips, which a slow
link would otherwise add to the call that happens to find the map stale).

What a worker says about itself routes nothing. A call's queue and whether its tool gets
the message history come from the orchestrator's own tool policy, whatever the entry
says; when workers disagree about a tool, the spec is picked by rules an entry cannot
bend (no worker-written timestamp decides), and the disagreement is logged once.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import redis

from orchestrator.dispatch.base import PlacementTable
from tool_workers.contract.errors import DispatchError
from tool_workers.contract.models import ToolSpec, WorkerEntry
from tool_workers.contract.names import placement_key, worker_registry_pattern
from tool_workers.contract.settings import Settings, ToolPolicies, ToolPolicy

log = logging.getLogger("toolfleet.registry")

PLACEMENT_TTL = 3600
"""Seconds a published tool placement is kept (``toolfleet status`` shows it)."""

CACHE_SECONDS = 1.0
"""How long a read of the registry is reused (one SCAN per second at most)."""

SCAN_COUNT = 10_000
"""Keys the server looks at per ``SCAN`` step: a read is one round trip per this many
keys in the database, whatever they are."""

FIRST_READ_SECONDS = 10.0
"""How long the first read of the registry retries while Redis is unreachable."""


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


def served_tools(
    entries: Iterable[WorkerEntry],
    policies: ToolPolicies,
    reported: set[str] | None = None,
) -> dict[str, ToolSpec]:
    """The tools some live worker serves, by name, governed by the orchestrator's policy.

    Of the specs the workers publish for one tool, the one from a worker whose queue
    matches the policy wins, then the one from the lexically first worker name. The
    winner's ``queue`` and ``inject_messages`` are replaced by the policy's.

    Args:
        entries: The live workers' registry entries.
        policies: The orchestrator's tool policy.
        reported: Disagreements already logged (each is logged once); none if omitted.
    """
    offers: dict[str, list[tuple[str, ToolSpec]]] = {}
    for entry in entries:
        for spec in entry.tools:
            offers.setdefault(spec.name, []).append((entry.worker, spec))
    tools: dict[str, ToolSpec] = {}
    for name, offered in offers.items():
        policy = policies.for_tool(name)
        worker, spec = min(offered, key=lambda o: (o[1].queue != policy.queue, o[0]))
        _report(name, offered, worker, spec, policy, reported)
        tools[name] = _governed(spec, policy)
    return tools


def _governed(spec: ToolSpec, policy: ToolPolicy) -> ToolSpec:
    """``spec`` with what only the orchestrator decides: where it runs, what it is sent."""
    options = {**spec.options, "inject_messages": policy.inject_messages}
    return spec.model_copy(update={"queue": policy.queue, "options": options})


def _report(
    name: str,
    offered: list[tuple[str, ToolSpec]],
    worker: str,
    chosen: ToolSpec,
    policy: ToolPolicy,
    reported: set[str] | None,
) -> None:
    """Log, once, workers that disagree about a tool or with the orchestrator's policy."""
    variants = {spec.model_dump_json() for _, spec in offered}
    if len(variants) == 1 and chosen.queue == policy.queue:
        return
    fingerprint = f"{name}\x1f{sorted((w, s.model_dump_json()) for w, s in offered)}"
    if reported is not None:
        if fingerprint in reported:
            return
        if len(reported) > 1024:
            reported.clear()
        reported.add(fingerprint)
    workers = ", ".join(sorted(f"{w} (queue {s.queue!r})" for w, s in offered))
    log.warning(
        "workers disagree about tool %s: %s; using the spec of %s, routed to queue %r by "
        "this orchestrator's policy",
        name,
        workers,
        worker,
        policy.queue,
    )


class RegistryView:
    """Cached, thread-safe reads of which workers are live and which tools they serve.

    A read that fails (Redis restarting, a network blip) does not fail the run that
    routes with it: the last map read is served until a read succeeds again (tried once
    a second), so calls already published are still collected. Only a view that never
    read the registry retries, for :data:`FIRST_READ_SECONDS`, then raises.
    """

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._client = client
        self._prefix = settings.key_prefix
        self._policies = settings.policies()
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        self._entries: list[WorkerEntry] = []
        self._tools: Mapping[str, ToolSpec] = MappingProxyType({})
        self._read_at = float("-inf")
        self._refreshing: concurrent.futures.Future[None] | None = None
        self._background = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="toolfleet-registry"
        )

    def refresh(self) -> None:
        """Read the registry now.

        Raises:
            DispatchError: it was never read and Redis stayed unreachable.
        """
        try:
            entries = read_entries(self._client, self._prefix)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._read_failed(exc)
            return
        with self._lock:
            self._entries = entries
            # Replaced whole, never mutated: readers share it without a copy.
            self._tools = MappingProxyType(self._served(entries))
            self._read_at = time.monotonic()

    def _served(self, entries: list[WorkerEntry]) -> dict[str, ToolSpec]:
        return served_tools(entries, self._policies, self._reported)

    def _read_failed(self, exc: Exception) -> None:
        if self._read_at != float("-inf"):
            log.warning("registry read failed (%r); routing with the last one read", exc)
            with self._lock:
                self._read_at = time.monotonic()  # the next try in a second, not per call
            return
        deadline = time.monotonic() + FIRST_READ_SECONDS
        delay = 0.1
        while time.monotonic() + delay < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            try:
                entries = read_entries(self._client, self._prefix)
            except (redis.ConnectionError, redis.TimeoutError) as again:
                exc = again
                continue
            with self._lock:
                self._entries = entries
                self._tools = MappingProxyType(self._served(entries))
                self._read_at = time.monotonic()
            return
        raise DispatchError(f"cannot read the tool registry: {exc!r}") from exc

    @property
    def stale(self) -> bool:
        """Whether the next read goes to Redis (the cached one is older than a second)."""
        return time.monotonic() - self._read_at > CACHE_SECONDS

    @property
    def read_once(self) -> bool:
        """Whether a map was read: from then on a stale one is refreshed in the background."""
        return self._read_at != float("-inf")

    def tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves, by name (``fresh``: read Redis first).

        Raises:
            DispatchError: the registry was never read and Redis stayed unreachable.
        """
        if fresh or not self.read_once:
            self.refresh()
        elif self.stale:
            self._refresh_in_background()
        with self._lock:
            return self._tools

    def _refresh_in_background(self) -> None:
        with self._lock:
            if self._refreshing is not None and not self._refreshing.done():
                return
            try:
                self._refreshing = self._background.submit(self._refresh_quietly)
            except RuntimeError:  # closed: the caller routes with the last map
                return

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # nobody waits for this read: say why it failed
            log.warning("registry read failed (%r); routing with the last one read", exc)

    def close(self) -> None:
        """Stop the background reads and close the view's Redis client (a read in
        progress finishes first)."""
        self._background.shutdown(wait=True)
        self._client.close()

    def workers(self) -> list[WorkerEntry]:
        """Every live worker's entry."""
        if self.stale:
            self.refresh()
        with self._lock:
            return list(self._entries)


def note_placement(client: redis.Redis, key_prefix: str, table: PlacementTable) -> None:
    """Publish this process's tool placement for ``toolfleet status`` (best effort)."""
    key = placement_key(key_prefix, socket.gethostname(), os.getpid())
    record = {"host": socket.gethostname(), "pid": os.getpid(), "at": time.time(), "tools": table}
    try:
        client.set(key, json.dumps(record), ex=PLACEMENT_TTL)
    except redis.RedisError as exc:
        log.warning("could not publish the tool placement: %r", exc)
