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


def _checkpoint(config: Mapping[str, Any] | None, thread_id: str | None) -> dict[str, Any] | None:
    if not config:
        return None
    conf = config.get("configurable") or {}
    return {
        "thread_id": thread_id or conf.get("thread_id"),
        "checkpoint_ns": conf.get("checkpoint_ns", ""),
        "checkpoint_id": conf.get("checkpoint_id"),
        "checkpoint_map": conf.get("checkpoint_map"),
    }


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
                "error": str(task.error) if task.error is not None else None,
                "interrupts": list(task.interrupts),
                "checkpoint": _checkpoint(state, thread_id) if isinstance(state, Mapping) else None,
                "state": thread_state(state, thread_id)
                if isinstance(state, StateSnapshot)
                else None,
                "result": task.result,
            }
        )
    return {
        "values": snapshot.values,
        "next": list(snapshot.next),
        "checkpoint": _checkpoint(snapshot.config, thread_id),
        "metadata": snapshot.metadata,
        "created_at": snapshot.created_at,
        "parent_checkpoint": _checkpoint(snapshot.parent_config, thread_id),
        "tasks": tasks,
        "interrupts": list(snapshot.interrupts),
    }
