"""The orchestrator's view of the tool registry the workers publish."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

import redis

from tool_workers.protocol import ToolSpec, WorkerEntry
from tool_workers.registry import read_entries, served_tools
from tool_workers.settings import Settings

CACHE_SECONDS = 1.0
"""How long a read of the registry is reused (one SCAN per second at most)."""


class RegistryView:
    """Cached, thread-safe reads of which workers are live and which tools they serve."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._client = client
        self._prefix = settings.key_prefix
        self._lock = threading.Lock()
        self._entries: list[WorkerEntry] = []
        self._tools: Mapping[str, ToolSpec] = MappingProxyType({})
        self._read_at = float("-inf")

    def refresh(self) -> None:
        """Read the registry now."""
        entries = read_entries(self._client, self._prefix)
        with self._lock:
            self._entries = entries
            # Replaced whole, never mutated: readers share it without a copy.
            self._tools = MappingProxyType(served_tools(entries))
            self._read_at = time.monotonic()

    def _fresh(self) -> None:
        if time.monotonic() - self._read_at > CACHE_SECONDS:
            self.refresh()

    def tools(self) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves, by name."""
        self._fresh()
        with self._lock:
            return self._tools

    def workers(self) -> list[WorkerEntry]:
        """Every live worker's entry."""
        self._fresh()
        with self._lock:
            return list(self._entries)


class _Serving(Protocol):
    def served_tools(self) -> Mapping[str, ToolSpec]: ...


def wait_served(dispatcher: _Serving, name: str, timeout: float) -> Mapping[str, ToolSpec]:
    """Poll until a worker serves ``name`` or ``timeout`` passes; the tools served then."""
    deadline = time.monotonic() + timeout
    while True:
        served = dispatcher.served_tools()
        if name in served or time.monotonic() >= deadline:
            return served
        time.sleep(0.25)


async def await_served(dispatcher: _Serving, name: str, timeout: float) -> Mapping[str, ToolSpec]:
    """Async flavour of :func:`wait_served`."""
    deadline = time.monotonic() + timeout
    while True:
        served = dispatcher.served_tools()
        if name in served or time.monotonic() >= deadline:
            return served
        await asyncio.sleep(0.25)
