"""``toolfleet late <thread>``: the late results of a thread's calls answered as lost.

A call answered as lost (its worker was cut off or died, and a non-idempotent tool was
not run again) may still have run to the end: when its result comes afterwards, it is
kept as the call's late result (:mod:`orchestrator.dispatch.late`). This lists them,
with their call ids, so the thread's owner can learn which effects did happen.
"""

from __future__ import annotations

import datetime
import json

from rich.console import Console
from rich.table import Table

from orchestrator.dispatch.late import late_results
from tool_workers.contract.connections import redis_client
from tool_workers.contract.settings import Settings


def run_late(settings: Settings, thread_id: str, *, as_json: bool, console: Console) -> int:
    """Print the thread's late results; the exit code (0, also when there are none)."""
    client = redis_client(settings.backend_url, settings)
    try:
        found = late_results(client, settings.key_prefix, thread_id, settings.signing_key)
    finally:
        client.close()
    if as_json:
        print(json.dumps([late.as_dict() for late in found], indent=2))
        return 0
    if not found:
        console.print(f"no late results for thread {thread_id}")
        return 0
    table = Table(title=f"late results of thread {thread_id}")
    for column in ("call id", "tool", "answered", "came", "status", "result"):
        table.add_column(column)
    for late in found:
        came = datetime.datetime.fromtimestamp(late.came_at, tz=datetime.UTC)
        table.add_row(
            late.call_id or late.task_id,
            late.tool or "?",
            late.answered or "as lost",
            came.isoformat(timespec="seconds"),
            late.status,
            late.content,
        )
    console.print(table)
    return 0
