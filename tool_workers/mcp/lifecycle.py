"""When a worker's MCP sessions start and stop.

A prefork pool's processes each start theirs as they start (``worker_process_init``),
never the parent that forks them; each stops its servers as it ends. The solo and
threads pools run calls in the main process, which starts its sessions at the first call
and stops them with the worker (``worker_shutdown``).
"""

from __future__ import annotations

from typing import Any

from celery import signals

from tool_workers.mcp.connections import Connections

_managed: list[Connections] = []


def manage(connections: Connections) -> None:
    """Start and stop ``connections`` with the worker's processes."""
    _managed.append(connections)


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _start(**_: Any) -> None:
    for connections in _managed:
        connections.start()


@signals.worker_process_shutdown.connect  # type: ignore[untyped-decorator]
@signals.worker_shutdown.connect  # type: ignore[untyped-decorator]
def _stop(**_: Any) -> None:
    for connections in _managed:
        connections.close()
