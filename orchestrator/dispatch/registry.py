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
from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType

import redis

from orchestrator.backoff import Backoff
from orchestrator.dispatch.base import PlacementTable
from tool_workers.contract.errors import DispatchError
from tool_workers.contract.fleet import read_entries
from tool_workers.contract.models import ToolSpec, WorkerEntry
from tool_workers.contract.names import placement_key, tool_queue
from tool_workers.contract.settings import Settings, ToolPolicies, ToolPolicy
from tool_workers.contract.toolnames import owner

log = logging.getLogger("toolfleet.registry")

REPORTS_KEPT = 1024
"""Reports of disagreeing workers remembered (made once each); past that they are made
again."""

PLACEMENT_TTL = 3600
"""Seconds a published tool placement is kept (``toolfleet status`` shows it)."""

CACHE_SECONDS = 1.0
"""How long a read of the registry is reused (one SCAN per second at most)."""

FIRST_READ_SECONDS = 10.0
"""How long the first read of the registry retries while Redis is unreachable."""


Served = dict[str, dict[str, ToolSpec]]
"""Tool name -> schema version -> its governed spec, the version shown to models first."""


def served_tools(
    entries: Iterable[WorkerEntry],
    policies: ToolPolicies,
    reported: set[str] | None = None,
    shared: Collection[str] = (),
) -> dict[str, ToolSpec]:
    """The tools some live worker serves, by name: for each, the version models are shown
    (the first of :func:`served_versions`)."""
    return {
        name: next(iter(versions.values()))
        for name, versions in served_versions(entries, policies, reported, shared).items()
    }


def served_versions(
    entries: Iterable[WorkerEntry],
    policies: ToolPolicies,
    reported: set[str] | None = None,
    shared: Collection[str] = (),
) -> Served:
    """Every version of every tool some live worker serves, governed by the orchestrator.

    A tool's versions are its distinct argument schemas (:func:`schema_version`): two
    live at once during a rolling upgrade. They are ordered for models: the version the
    most live workers serve first, then the one whose lexically first worker comes first
    (no worker-written timestamp decides). Of the specs of one version, the one from a
    worker whose queue matches the policy wins, then the lexically first worker's.

    Each version is routed by tool: to its tool queue (``tool:<name>:<version>``), which
    only workers serving the tool at that version consume; a tool the policy file routes
    by hand (its own ``queue``, or one under ``[defaults]``) goes to that queue instead.

    Args:
        entries: The live workers' registry entries.
        policies: The orchestrator's tool policy.
        reported: Disagreements already logged (each is logged once); none if omitted.
        shared: Names workers of several sources may serve; any other name is served
            by its owner's workers alone (:mod:`tool_workers.contract.toolnames`).
    """
    entries = list(entries)
    sources: dict[str, set[str]] = {}
    for entry in entries:
        for spec in entry.tools:
            sources.setdefault(spec.name, set()).add(spec.source)
    offers: dict[str, dict[str, list[tuple[WorkerEntry, ToolSpec]]]] = {}
    for entry in entries:
        for spec in entry.tools:
            owned_by = None if spec.name in shared else owner(spec.name, sources[spec.name])
            if owned_by is not None and spec.source and spec.source != owned_by:
                _report_taken(spec.name, spec.source, owned_by, entry.worker, reported)
                continue
            offers.setdefault(spec.name, {}).setdefault(spec.version, []).append((entry, spec))
    served: Served = {}
    for name, by_version in offers.items():
        policy = policies.for_tool(name)
        explicit = policies.explicit_queue(name)
        picked = {
            version: min(offered, key=lambda o: (o[1].queue != policy.queue, o[0].worker))
            for version, offered in by_version.items()
        }
        order = sorted(
            by_version,
            key=lambda v: (
                -len({e.worker for e, _ in by_version[v]}),
                picked[v][1].queue != policy.queue,
                picked[v][0].worker,
            ),
        )
        _report(name, by_version, picked[order[0]], policy, reported)
        if explicit is not None:
            _report_by_hand(name, explicit, entries, reported)
        served[name] = {
            version: _governed(picked[version][1], policy, explicit, by_version[version])
            for version in order
        }
    return served


def _governed(
    spec: ToolSpec,
    policy: ToolPolicy,
    explicit: str | None,
    offered: list[tuple[WorkerEntry, ToolSpec]],
) -> ToolSpec:
    """``spec`` with what only the orchestrator decides: where it runs, what it is sent."""
    options = {**spec.options, "inject_messages": policy.inject_messages}
    queue = explicit
    if queue is None:
        own = tool_queue(spec.name, spec.version)
        # Workers from before routing by tool consume no tool queue: the policy's queue.
        routed = own is not None and any(own in entry.queues for entry, _ in offered)
        queue = own if routed else policy.queue
    return spec.model_copy(update={"queue": queue, "options": options})


def _report(
    name: str,
    by_version: dict[str, list[tuple[WorkerEntry, ToolSpec]]],
    chosen: tuple[WorkerEntry, ToolSpec],
    policy: ToolPolicy,
    reported: set[str] | None,
) -> None:
    """Log, once, workers that disagree about a tool or with the orchestrator's policy."""
    offered = [(e.worker, s) for offers in by_version.values() for e, s in offers]
    variants = {spec.model_dump_json() for _, spec in offered}
    if len(variants) == 1 and chosen[1].queue == policy.queue:
        return
    if not _first_report(
        f"{name}\x1f{sorted((w, s.model_dump_json()) for w, s in offered)}", reported
    ):
        return
    workers = ", ".join(sorted(f"{w} (version {s.version}, queue {s.queue!r})" for w, s in offered))
    if len(by_version) > 1:
        log.warning(
            "tool %s is served at %d versions: %s; models are shown version %s (of %s), "
            "and each call runs on a worker of the version it was made with",
            name,
            len(by_version),
            workers,
            chosen[1].version,
            chosen[0].worker,
        )
        return
    log.warning(
        "workers disagree about tool %s: %s; using the spec of %s, routed by this "
        "orchestrator's policy",
        name,
        workers,
        chosen[0].worker,
    )


def _first_report(fingerprint: str, reported: set[str] | None) -> bool:
    """Whether a report is made for the first time (``reported``: those made, forgotten
    past :data:`REPORTS_KEPT`; ``None``: every report is made)."""
    if reported is None:
        return True
    if fingerprint in reported:
        return False
    if len(reported) >= REPORTS_KEPT:
        reported.clear()
    reported.add(fingerprint)
    return True


def _report_taken(
    name: str, source: str, owned_by: str, worker: str, reported: set[str] | None
) -> None:
    """Log, once, a worker offering a name another source serves (its offer is ignored)."""
    if not _first_report(f"taken\x1f{name}\x1f{source}\x1f{worker}", reported):
        return
    log.error(
        "worker %s offers tool %s from %s, but %s serves that name: its offer is ignored "
        "(TOOLFLEET_REGISTRY_SHARED_NAMES lets several sources serve a name)",
        worker,
        name,
        source,
        owned_by,
    )


def _report_by_hand(
    name: str, queue: str, entries: list[WorkerEntry], reported: set[str] | None
) -> None:
    """Log, once, a queue the policy routes ``name`` to whose consumers do not all serve
    it (each such consumer hands the call on: a hop, or an error if none serves it)."""
    missing = sorted(
        e.worker for e in entries if queue in e.queues and name not in {t.name for t in e.tools}
    )
    if not missing:
        return
    if not _first_report(f"by-hand\x1f{name}\x1f{queue}\x1f{missing}", reported):
        return
    log.warning(
        "the policy file routes %s to queue %r, but %s consume(s) that queue without "
        "serving %s: calls they receive are handed on; remove the tool's queue from the "
        "policy to route it by tool",
        name,
        queue,
        ", ".join(missing),
        name,
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
        self._shared = settings.registry_shared_names
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        self._entries: list[WorkerEntry] = []
        self._tools: Mapping[str, ToolSpec] = MappingProxyType({})
        self._versions: Mapping[str, Mapping[str, ToolSpec]] = MappingProxyType({})
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
        self._store(entries)

    def _store(self, entries: list[WorkerEntry]) -> None:
        versions = served_versions(entries, self._policies, self._reported, self._shared)
        with self._lock:
            self._entries = entries
            # Replaced whole, never mutated: readers share them without a copy.
            self._versions = MappingProxyType(
                {name: MappingProxyType(by) for name, by in versions.items()}
            )
            self._tools = MappingProxyType(
                {name: next(iter(by.values())) for name, by in versions.items()}
            )
            self._read_at = time.monotonic()

    def _read_failed(self, exc: Exception) -> None:
        if self._read_at != float("-inf"):
            log.warning("registry read failed (%r); routing with the last one read", exc)
            with self._lock:
                self._read_at = time.monotonic()  # the next try in a second, not per call
            return
        deadline = time.monotonic() + FIRST_READ_SECONDS
        backoff = Backoff()
        while time.monotonic() + (delay := backoff.next()) < deadline:
            time.sleep(delay)
            try:
                entries = read_entries(self._client, self._prefix)
            except (redis.ConnectionError, redis.TimeoutError) as again:
                exc = again
                continue
            self._store(entries)
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

    def versions(self, name: str) -> Mapping[str, ToolSpec]:
        """Every version of ``name`` served in the map last read (no read), shown-to-models
        first; empty when none is."""
        with self._lock:
            return self._versions.get(name, MappingProxyType({}))

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
