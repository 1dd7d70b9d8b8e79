"""Late results: the real result of a call that was already answered as lost.

A worker cut off from Redis may finish a call after its lease lapsed and the call was
handed on. For a non-idempotent tool, the next attempt does not run it again: the model
is answered that the call may have partially run (``redelivered``), or that its worker
was lost (``worker_lost``). When the cut worker's result comes after that, the fence
refuses it as the call's answer and the worker keeps it as the call's *late result*
(:mod:`tool_workers.celery_ext.backend`): a record under
:func:`~tool_workers.contract.names.late_key`, a notice on the reply channel, a log line
and a count in the worker's metrics.

On this side:

- each call answered as lost is noted under its thread
  (:func:`~tool_workers.contract.names.lost_key`, for the result expiry), so
  :func:`late_results` finds a thread's late results whenever its owner asks, even when
  no orchestrator heard the notice (``toolfleet late <thread>``);
- a late notice heard on the reply channel is logged on the call log (``tool call
  result came late``, with the call's ids), counted, and handed to the hooks added with
  :meth:`LostCalls.on_late`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import redis

from orchestrator.call import PreparedCall
from orchestrator.dispatch.outcome import result_from_meta
from tool_workers.contract.models import ToolResult
from tool_workers.contract.names import LATE_FIELD, late_key, lost_key

log = logging.getLogger("toolfleet.orchestrator")
calls_log = logging.getLogger("toolfleet.orchestrator.calls")

LOST_KINDS = frozenset({"redelivered", "worker_lost"})
"""Error kinds of an answer that says the call may have run: its late result may come."""

MEMORY = 4096
"""Calls answered as lost remembered here, to name the call of a late notice."""

LATE_OPENING = b'{"' + LATE_FIELD.encode() + b'":'
"""How a late notice on the reply channel starts."""


@dataclass(frozen=True)
class LateResult:
    """A call's real result that came after the call was answered as lost."""

    task_id: str
    call_id: str | None
    """The model's ``tool_call_id`` (``None`` when no note of the call was found)."""
    tool: str | None
    thread_id: str | None
    run_id: str | None
    answered: str | None
    """The error kind the call was answered with (``redelivered``, ``worker_lost``)."""
    came_at: float
    """When the late result came (Unix time)."""
    status: str
    """``success`` or ``error``: the late result's own status."""
    error_kind: str | None
    content: str
    """The late result's text (what the model would have read)."""

    def as_dict(self) -> dict[str, Any]:
        """The record as plain JSON values."""
        return asdict(self)


class LostCalls:
    """The calls a dispatcher answered as lost, and the late notices of their results.

    Args:
        client: A Redis client of the result backend (the notes are written there).
        key_prefix: The deployment's key prefix.
        expires: Seconds a note lives (the result expiry: a late record lives as long).
        io: Threads that write the notes (never the waiter's thread).
        signing_key: Late results are refused unless signed for their call, as results.
    """

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str,
        expires: int,
        io: concurrent.futures.Executor,
        signing_key: str | None = None,
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._expires = expires
        self._io = io
        self._signing_key = signing_key
        self._lock = threading.Lock()
        self._calls: collections.OrderedDict[str, tuple[PreparedCall, str]] = (
            collections.OrderedDict()
        )
        self._hooks: list[Callable[[LateResult], None]] = []
        self.heard_count = 0
        """Late notices heard by this process."""

    def on_late(self, hook: Callable[[LateResult], None]) -> Callable[[], None]:
        """Call ``hook`` with each late result heard (from the listener's thread); the
        function returned removes it."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    def answered(self, call: PreparedCall, result: ToolResult) -> None:
        """``call`` was answered with ``result``: noted when it says the call was lost."""
        kind = result.error_kind
        if kind not in LOST_KINDS:
            return
        with self._lock:
            self._calls[call.task_id] = (call, kind)
            while len(self._calls) > MEMORY:
                self._calls.popitem(last=False)
        if call.thread_id is None:
            return
        note = json.dumps(
            {"call_id": call.call_id, "tool": call.tool, "run_id": call.run_id, "answered": kind}
        )
        try:
            self._io.submit(self._note, lost_key(self._prefix, call.thread_id), call.task_id, note)
        except RuntimeError:  # closed
            return

    def _note(self, key: str, task_id: str, note: str) -> None:
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(key, task_id, note)
                pipe.expire(key, self._expires)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not note call %s as answered lost: %r", task_id, exc)

    def heard(self, raw: bytes) -> None:
        """A late notice on the reply channel: log it, count it, tell the hooks."""
        record = _record(raw)
        if record is None:
            return
        task_id = str(record["meta"].get("task_id") or "")
        with self._lock:
            known = self._calls.get(task_id)
        call, answered = known if known is not None else (None, None)
        late = _late_result(
            task_id,
            record,
            None if call is None else _note_of(call, answered),
            self._signing_key,
        )
        self.heard_count += 1
        if late.answered is not None:
            log.warning(
                "call %s to %s (thread %s) was answered %s; its result came late: %s",
                late.call_id,
                late.tool,
                late.thread_id,
                late.answered,
                late.status,
            )
        else:  # not answered as lost here: another attempt's result was the answer
            log.info("a stale attempt's result of call %s came after another's answer", task_id)
        calls_log.info(
            "tool call result came late",
            extra={
                "toolfleet": {
                    "side": "orchestrator",
                    "event": "late_result",
                    "tool": late.tool,
                    "tool_call_id": late.call_id,
                    "thread_id": late.thread_id,
                    "run_id": late.run_id,
                    "task_id": task_id,
                    "answered": late.answered,
                    "outcome": late.error_kind or "success",
                }
            },
        )
        for hook in list(self._hooks):
            try:
                hook(late)
            except Exception:
                log.exception("late result hook failed")


def late_results(
    client: redis.Redis, key_prefix: str, thread_id: str, signing_key: str | None = None
) -> list[LateResult]:
    """The late results of a thread's calls answered as lost, oldest first.

    Args:
        client: A Redis client of the result backend.
        key_prefix: The deployment's key prefix.
        thread_id: The thread.
        signing_key: ``TOOLFLEET_SIGNING_KEY``: unsigned late results are refused.
    """
    notes = client.hgetall(lost_key(key_prefix, thread_id))
    if not notes:
        return []
    ids = [_text(t) for t in notes]
    records = client.mget([late_key(key_prefix, t) for t in ids])
    found = []
    for task_id, raw in zip(ids, records, strict=True):
        record = _record(raw)
        if record is None:
            continue
        note = _json(notes.get(task_id.encode(), notes.get(task_id)))
        found.append(_late_result(task_id, record, {**note, "thread_id": thread_id}, signing_key))
    return sorted(found, key=lambda late: late.came_at)


def _note_of(call: PreparedCall, answered: str | None) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "tool": call.tool,
        "thread_id": call.thread_id,
        "run_id": call.run_id,
        "answered": answered,
    }


def _late_result(
    task_id: str,
    record: Mapping[str, Any],
    note: Mapping[str, Any] | None,
    signing_key: str | None,
) -> LateResult:
    note = note or {}
    tool = note.get("tool")
    result = result_from_meta(
        dict(record["meta"]), str(tool or "tool"), task_id=task_id, signing_key=signing_key
    )
    return LateResult(
        task_id=task_id,
        call_id=note.get("call_id"),
        tool=tool,
        thread_id=note.get("thread_id"),
        run_id=note.get("run_id"),
        answered=note.get("answered"),
        came_at=float(record.get(LATE_FIELD) or time.time()),
        status=result.status,
        error_kind=result.error_kind,
        content=str(result.content),
    )


def _record(raw: bytes | str | None) -> dict[str, Any] | None:
    """A late record (``{"late_at": ..., "meta": {...}}``), or ``None`` if it is not one."""
    record = _json(raw)
    if LATE_FIELD not in record or not isinstance(record.get("meta"), dict):
        return None
    return record


def _json(raw: bytes | str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
