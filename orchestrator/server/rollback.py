"""Rolling a run back: deleting the checkpoints (and their pending writes) it wrote.

A run cancelled with ``action="rollback"`` (or superseded by a run with multitask
strategy ``rollback``) leaves its thread as it was before the run, as LangGraph's server
does: the run's record goes, and so do the checkpoints whose metadata names the run.

The checkpointers this server opens (SQLite, PostgreSQL) do not implement LangGraph's
``adelete_for_runs``, so the rows are deleted here, by thread and by the ``run_id`` in
each checkpoint's metadata (the run's config puts it there), on the saver's connection
and under its lock (its ``conn`` and ``lock`` attributes). Other checkpointers are asked
through ``adelete_for_runs``.
"""

from __future__ import annotations

import logging
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

log = logging.getLogger("toolfleet.server")


async def delete_run_checkpoints(
    checkpointer: BaseCheckpointSaver[Any], thread: str, run_id: str
) -> None:
    """Delete the checkpoints of thread key ``thread`` that run ``run_id`` wrote."""
    kind = type(checkpointer).__name__
    if kind == "AsyncSqliteSaver":
        await _sqlite(checkpointer, thread, run_id)
    elif kind == "AsyncPostgresSaver":
        await _postgres(checkpointer, thread, run_id)
    else:
        await checkpointer.adelete_for_runs([run_id])


async def _sqlite(saver: Any, thread: str, run_id: str) -> None:
    match = "thread_id = ? AND json_extract(CAST(metadata AS TEXT), '$.run_id') = ?"
    async with saver.lock, saver.conn.cursor() as cur:
        await cur.execute(
            "DELETE FROM writes WHERE thread_id = ? AND checkpoint_id IN "
            f"(SELECT checkpoint_id FROM checkpoints WHERE {match})",
            (thread, thread, run_id),
        )
        await cur.execute(f"DELETE FROM checkpoints WHERE {match}", (thread, run_id))
        await saver.conn.commit()


async def _postgres(saver: Any, thread: str, run_id: str) -> None:
    # On the saver's own connection (its pool's, or its one connection) under its lock,
    # as its own writes go.
    from psycopg_pool import AsyncConnectionPool

    async with saver.lock:
        if isinstance(saver.conn, AsyncConnectionPool):
            async with saver.conn.connection() as conn:
                await _postgres_delete(conn, thread, run_id)
        else:
            await _postgres_delete(saver.conn, thread, run_id)


async def _postgres_delete(conn: Any, thread: str, run_id: str) -> None:
    match = "thread_id = %s AND metadata->>'run_id' = %s"
    # One transaction: the run's pending writes and checkpoints go together or not at all.
    async with conn.transaction(), conn.cursor() as cur:
        await cur.execute(
            "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_id IN "
            f"(SELECT checkpoint_id FROM checkpoints WHERE {match})",
            (thread, thread, run_id),
        )
        await cur.execute(f"DELETE FROM checkpoints WHERE {match}", (thread, run_id))
