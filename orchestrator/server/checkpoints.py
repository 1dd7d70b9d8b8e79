"""Copying a thread's checkpoints to another thread, with any LangGraph checkpointer.

The SQLite and Postgres savers leave ``acopy_thread`` unimplemented, so a copy is made
through the interface every saver has: each checkpoint (every namespace, oldest first) is
put again under the new thread with its parent, its metadata and all its channel
versions, then the writes pending on it. The copy is a thread of its own from then on:
runs on either leave the other as it was.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple


async def copy_checkpoints(checkpointer: BaseCheckpointSaver[Any], source: str, target: str) -> int:
    """Copy every checkpoint and pending write of thread ``source`` to thread ``target``.

    Args:
        checkpointer: The server's checkpointer.
        source: The LangGraph thread id to copy (a thread key).
        target: The LangGraph thread id of the copy (a thread key without checkpoints).

    Returns:
        How many checkpoints were copied.
    """
    found: list[CheckpointTuple] = [
        t async for t in checkpointer.alist({"configurable": {"thread_id": source}})
    ]
    # Newest first from the saver: parents are put before their children.
    for saved in reversed(found):
        conf = saved.config["configurable"]
        namespace = conf.get("checkpoint_ns", "")
        parent: dict[str, Any] = {"thread_id": target, "checkpoint_ns": namespace}
        if saved.parent_config is not None:
            parent["checkpoint_id"] = saved.parent_config["configurable"]["checkpoint_id"]
        checkpoint = saved.checkpoint
        # Every channel "changed": a saver storing blobs per version (Postgres) writes
        # them all for the copy.
        written = await checkpointer.aput(
            {"configurable": parent},
            checkpoint,
            saved.metadata,
            dict(checkpoint["channel_versions"]),
        )
        by_task: defaultdict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in saved.pending_writes or ():
            by_task[task_id].append((channel, value))
        for task_id, writes in by_task.items():
            await checkpointer.aput_writes(written, writes, task_id)
    return len(found)
