"""The orchestrator's registry view: a Redis blip never fails the run routing with it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


class FlakyRegistry:
    """SCAN and MGET of one registry entry; fails while ``down``."""

    def __init__(self, entry: Any) -> None:
        self.entry = entry
        self.down = False
        self.reads = 0

    def scan_iter(self, match: str, count: int) -> Iterator[bytes]:
        self.reads += 1
        if self.down:
            import redis

            raise redis.TimeoutError("Timeout reading from socket")
        yield b"toolfleet:workers:w1"

    def mget(self, keys: list[bytes]) -> list[str]:
        return [self.entry.model_dump_json()]


def test_given_registry_read_failing_after_a_good_one_then_last_map_is_served() -> None:
    from orchestrator.dispatch.registry import RegistryView
    from tool_workers.protocol import ToolSpec, WorkerEntry
    from tool_workers.settings import Settings

    entry = WorkerEntry(
        worker="w1", pid=1, queues=["tools"], tools=[ToolSpec(name="grep")], updated_at=0.0
    )
    client = FlakyRegistry(entry)
    view = RegistryView(client, Settings())  # type: ignore[arg-type]
    assert set(view.tools(fresh=True)) == {"grep"}

    client.down = True
    assert set(view.tools(fresh=True)) == {"grep"}  # a blip: route with what was read
    reads = client.reads
    assert set(view.tools()) == {"grep"} and client.reads == reads  # not retried per call


def test_given_registry_never_readable_then_dispatch_error(monkeypatch: Any) -> None:
    from orchestrator.dispatch import registry
    from tool_workers.errors import DispatchError
    from tool_workers.protocol import WorkerEntry
    from tool_workers.settings import Settings

    monkeypatch.setattr(registry, "FIRST_READ_SECONDS", 0.5)
    client = FlakyRegistry(WorkerEntry(worker="w1", pid=1, queues=[], tools=[], updated_at=0))
    client.down = True

    with pytest.raises(DispatchError):
        registry.RegistryView(client, Settings()).tools()  # type: ignore[arg-type]
    assert client.reads > 1  # retried before giving up
