"""The tool registry, worker side: each worker publishes what it serves.

A worker writes one key (``<prefix>workers:<node name>``) holding a
:class:`~tool_workers.contract.WorkerEntry`: its queues and, for every tool routed to a
queue it consumes, the tool's name, description, JSON schema, ``return_direct``, queue
and options. The key is refreshed every ``registry_refresh`` seconds and expires after
three missed refreshes, so a tool no live worker serves drops out of the registry.
Two processes started with one node name would share that key and hide each other, so
each also notes itself (``host:pid``, scored by time) in the name's
``worker-processes`` set, where ``toolfleet status`` sees the twin.
Orchestrators read it with :mod:`orchestrator.dispatch.registry`. A worker that would
serve a name another kind of worker serves does not start (:func:`check_names`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Collection, Iterable, Mapping

import redis

from tool_workers.contract.errors import ConfigError
from tool_workers.contract.models import ToolSpec, WorkerEntry
from tool_workers.contract.names import (
    REGISTRY_TTL_REFRESHES,
    worker_processes_key,
    worker_registry_key,
)
from tool_workers.contract.primary import note_primary, sentinel_primary
from tool_workers.contract.toolnames import refusal

log = logging.getLogger("toolfleet.registry")

TTL_REFRESHES = REGISTRY_TTL_REFRESHES
"""A worker entry outlives this many refresh intervals without a refresh."""


def build_entry(
    worker: str,
    queues: Iterable[str],
    specs: Iterable[ToolSpec],
    isolation: Mapping[str, str] | None = None,
) -> WorkerEntry:
    """The entry for a worker consuming ``queues``: only tools routed to those queues.

    ``isolation`` maps a tool that runs code (``run_python``) to the isolation between its
    calls; the entry names it when that tool is among those served.
    """
    queue_set = sorted(set(queues))
    tools = [spec for spec in specs if spec.queue in queue_set]
    named = isolation or {}
    served = [named[spec.name] for spec in tools if spec.name in named]
    return WorkerEntry(
        worker=worker,
        pid=os.getpid(),
        queues=queue_set,
        tools=tools,
        updated_at=time.time(),
        sandbox_isolation=served[0] if served else None,
    )


def check_names(
    entries: Iterable[WorkerEntry], specs: Iterable[ToolSpec], shared: Collection[str]
) -> None:
    """Refuse to serve a name another source serves (:mod:`tool_workers.contract.toolnames`).

    Args:
        entries: The live workers' registry entries.
        specs: The tools the starting worker would serve, each with its source.
        shared: Names several sources may serve (``TOOLFLEET_REGISTRY_SHARED_NAMES``).

    Raises:
        ConfigError: one of ``specs`` may not be served by this worker (the first found).
    """
    live: dict[str, set[str]] = {}
    for entry in entries:
        for offered in entry.tools:
            live.setdefault(offered.name, set()).add(offered.source)
    for spec in specs:
        reason = refusal(spec.name, spec.source, live.get(spec.name, ()), shared)
        if reason is not None:
            raise ConfigError(f"this worker does not start: {reason}")


class RegistryPublisher:
    """Keeps one worker's registry entry fresh from a daemon thread."""

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str,
        entry: WorkerEntry,
        refresh: float,
    ) -> None:
        self._client = client
        self._key_prefix = key_prefix
        self._key = worker_registry_key(key_prefix, entry.worker)
        self._processes_key = worker_processes_key(key_prefix, entry.worker)
        self._member = f"{socket.gethostname()}:{os.getpid()}"
        self._entry = entry
        self._refresh = refresh
        self._ttl_ms = max(int(refresh * TTL_REFRESHES * 1000), 1000)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        """Write the entry now, and note the primary the Sentinels name, if any (raises
        on a Redis error)."""
        now = time.time()
        entry = self._entry.model_copy(update={"updated_at": now})
        primary = sentinel_primary(self._client)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.set(self._key, entry.model_dump_json(), px=self._ttl_ms)
            pipe.zadd(self._processes_key, {self._member: now})
            pipe.zremrangebyscore(self._processes_key, "-inf", now - self._ttl_ms / 1000)
            pipe.pexpire(self._processes_key, self._ttl_ms)
            if primary is not None:
                note_primary(pipe, self._key_prefix, primary)
            pipe.execute()

    def start(self) -> None:
        """Publish now, then keep refreshing until :meth:`stop`."""
        self.publish()
        self._thread = threading.Thread(target=self._loop, name="toolfleet-registry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._refresh):
            try:
                self.publish()
            except redis.RedisError as exc:  # the broker may be restarting; try next time
                log.warning("registry refresh failed: %r", exc)

    def stop(self) -> None:
        """Stop refreshing and remove the entry, so the worker's tools drop out at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._client.delete(self._key)
            self._client.zrem(self._processes_key, self._member)
        except redis.RedisError as exc:
            log.warning("could not remove registry entry %s: %r", self._key, exc)
