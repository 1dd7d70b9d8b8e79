"""Copying a thread's checkpoints to another thread, and sizing them, with any LangGraph
checkpointer.

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


async def thread_storage(checkpointer: BaseCheckpointSaver[Any], thread: str) -> dict[str, Any]:
    """Bytes thread ``thread``'s checkpoints occupy, as LangGraph's server reports them
    (``GET /threads/{id}/storage``): checkpoints, channel values per channel (each
    version once) and pending writes, counted and sized as the saver's serializer
    writes them.

    Args:
        checkpointer: The server's checkpointer.
        thread: The LangGraph thread id (a thread key).

    Returns:
        ``total_bytes``, ``checkpoints``, ``channel_values`` (with ``by_channel``) and
        ``pending_writes``, each part ``{"count", "bytes"}``.
    """
    serde = checkpointer.serde
    by_channel: dict[str, dict[str, int]] = {}
    seen: set[tuple[str, str, Any]] = set()
    checkpoints = checkpoint_bytes = writes = write_bytes = 0
    async for saved in checkpointer.alist({"configurable": {"thread_id": thread}}):
        namespace = saved.config["configurable"].get("checkpoint_ns", "")
        checkpoint = saved.checkpoint
        values = checkpoint.get("channel_values") or {}
        bare = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        checkpoints += 1
        checkpoint_bytes += _size(serde, bare) + _size(serde, saved.metadata)
        for channel, version in checkpoint["channel_versions"].items():
            if channel not in values or (namespace, channel, version) in seen:
                continue
            seen.add((namespace, channel, version))
            entry = by_channel.setdefault(channel, {"versions": 0, "bytes": 0})
            entry["versions"] += 1
            entry["bytes"] += _size(serde, values[channel])
        for _task, _channel, value in saved.pending_writes or ():
            writes += 1
            write_bytes += _size(serde, value)
    channel_bytes = sum(entry["bytes"] for entry in by_channel.values())
    return {
        "total_bytes": checkpoint_bytes + channel_bytes + write_bytes,
        "checkpoints": {"count": checkpoints, "bytes": checkpoint_bytes},
        "channel_values": {
            "count": sum(entry["versions"] for entry in by_channel.values()),
            "bytes": channel_bytes,
            "by_channel": by_channel,
        },
        "pending_writes": {"count": writes, "bytes": write_bytes},
    }


def _size(serde: Any, value: Any) -> int:
    return len(serde.dumps_typed(value)[1])
