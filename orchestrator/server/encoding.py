"""JSON and SSE encodings of what the graph produces, in the shapes Agent Protocol clients read.

Messages become their ``model_dump()`` (``{"type": "ai", "content": ..., "tool_calls":
...}``), interrupts ``{"value": ..., "id": ...}``, a state snapshot a ``ThreadState``.
Anything else that JSON cannot carry is written as its ``str()``: a stream part is never
dropped because one field of it is exotic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson
from langgraph.types import StateSnapshot


def _default(obj: Any) -> Any:
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump()
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    return str(obj)


def dumps(value: Any) -> bytes:
    """``value`` as JSON bytes (non-string dict keys allowed, exotic values as text)."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS)


def loads(raw: bytes | str) -> Any:
    """Parse JSON."""
    return orjson.loads(raw)


def sse_frame(event: str, data: bytes, event_id: str | None = None) -> bytes:
    """One server-sent event: ``event:``, optional ``id:``, one ``data:`` line.

    ``data`` is JSON from :func:`dumps`, which never contains a raw newline.
    """
    head = b"event: " + event.encode() + b"\n"
    if event_id:
        head += b"id: " + event_id.encode() + b"\n"
    return head + b"data: " + data + b"\n\n"


SSE_HEARTBEAT = b": heartbeat\n\n"
"""An SSE comment: keeps idle connections open through proxies; clients ignore it."""


def checkpoint_of(config: Mapping[str, Any] | None, thread_id: str | None) -> dict[str, Any] | None:
    """The checkpoint a config points at, as LangGraph's server shows it: ``None`` unless
    it names a checkpoint id, ``checkpoint_map`` only where the config has one."""
    conf = (config or {}).get("configurable") or {}
    if not conf.get("checkpoint_id") or not (thread_id or conf.get("thread_id")):
        return None
    checkpoint = {
        "thread_id": thread_id or conf["thread_id"],
        "checkpoint_ns": conf.get("checkpoint_ns") or "",
        "checkpoint_id": conf["checkpoint_id"],
    }
    if "checkpoint_map" in conf:
        checkpoint["checkpoint_map"] = conf["checkpoint_map"]
    return checkpoint


def _task_checkpoint(state: Any, thread_id: str | None) -> dict[str, Any] | None:
    """A task's subgraph checkpoint (the ``configurable`` of its state's config)."""
    if not isinstance(state, Mapping) or not state.get("configurable"):
        return None
    conf = dict(state["configurable"])
    if thread_id:
        conf["thread_id"] = thread_id
    return conf


def _checkpoint_id(config: Mapping[str, Any] | None) -> str | None:
    return ((config or {}).get("configurable") or {}).get("checkpoint_id")


def thread_state(snapshot: StateSnapshot, thread_id: str | None = None) -> dict[str, Any]:
    """A LangGraph state snapshot as the protocol's ``ThreadState``.

    Args:
        snapshot: The snapshot.
        thread_id: The thread id the client knows the thread by, shown in the checkpoints
            instead of the graph's own (the thread key).
    """
    tasks = []
    for task in snapshot.tasks:
        state = task.state
        tasks.append(
            {
                "id": task.id,
                "name": task.name,
                "path": list(task.path),
                "error": str(task.error) if task.error is not None else None,
                "interrupts": list(task.interrupts),
                "checkpoint": _task_checkpoint(state, thread_id),
                "state": thread_state(state, thread_id)
                if isinstance(state, StateSnapshot)
                else None,
                "result": task.result,
            }
        )
    return {
        "values": snapshot.values,
        "next": list(snapshot.next),
        "checkpoint": checkpoint_of(snapshot.config, thread_id),
        # As LangGraph's server records it in every checkpoint (LangGraph itself leaves it out).
        "metadata": (
            {**snapshot.metadata, "thread_id": thread_id}
            if snapshot.metadata is not None and thread_id
            else snapshot.metadata
        ),
        "created_at": snapshot.created_at,
        "parent_checkpoint": checkpoint_of(snapshot.parent_config, thread_id),
        "tasks": tasks,
        "interrupts": list(snapshot.interrupts),
        "checkpoint_id": _checkpoint_id(snapshot.config),
        "parent_checkpoint_id": _checkpoint_id(snapshot.parent_config),
    }
