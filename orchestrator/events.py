"""Tool-call progress, written to the run's ``custom`` stream as it happens."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import Any

from langgraph.prebuilt.tool_node import ToolCallRequest

from orchestrator.calls import PreparedCall
from orchestrator.dispatch.watch import PROGRESS
from tool_workers.contract.models import HEARTBEAT, ToolResult
from tool_workers.contract.wire_json import from_wire

log = logging.getLogger("toolfleet.orchestrator")


class ToolCallEvents:
    """Tool-call progress written to the run's ``custom`` stream.

    Each event is ``{"toolfleet": {"event": "dispatched" | "started" | "finished" |
    "cancelled", ...}}``
    with the call's ``tool_call_id``, ``tool`` and ``task_id``; ``started`` names the worker
    and pid, ``finished`` the status, worker and duration. A UI can draw a fan-out live.
    """

    def __init__(self, request: ToolCallRequest) -> None:
        runtime = request.runtime
        self._write = getattr(runtime, "stream_writer", None) if runtime is not None else None
        self._names: dict[str, tuple[str, str]] = {}
        # LangGraph's writer reads the run's config from a context variable; state changes
        # arrive on the listener thread, so they write from a copy of this context.
        self._context = contextvars.copy_context()
        self._context_lock = threading.Lock()
        self._thread = threading.current_thread()
        self._order_lock = threading.Lock()
        self._said_dispatched: set[str] = set()

    def _emit(self, event: str, **fields: Any) -> None:
        if self._write is None:
            return
        self._write_payload({"toolfleet": {"event": event, "ts": time.time(), **fields}})

    def _write_payload(self, payload: Any) -> None:
        if self._write is None:
            return
        try:
            if threading.current_thread() is self._thread:
                self._write(payload)
            else:
                with self._context_lock:
                    self._context.run(self._write, payload)
        except Exception:  # progress reporting never fails a call
            log.debug("could not write a tool-call event", exc_info=True)

    def track(self, calls: list[PreparedCall]) -> None:
        """Remember the calls, so their state changes can name them."""
        for call in calls:
            self._names[call.task_id] = (call.call_id, call.tool)

    def dispatched(self, call: PreparedCall) -> None:
        """The call is on the broker (said once, before anything else about it)."""
        self._dispatched_once(call.task_id)

    def _dispatched_once(self, task_id: str) -> None:
        with self._order_lock:
            if task_id in self._said_dispatched:
                return
            self._said_dispatched.add(task_id)
            call_id, tool = self._names.get(task_id, ("", ""))
            self._emit("dispatched", tool_call_id=call_id, tool=tool, task_id=task_id)

    def on_state(self, task_id: str, state: str | None, meta: dict[str, Any]) -> None:
        """Listener callback: a call's Celery state changed, or it reported progress."""
        if state == PROGRESS:
            self._progress(task_id, meta.get("progress") or [])
            return
        if state != "STARTED":
            return
        # A worker can report the start before the publishing thread returns.
        self._dispatched_once(task_id)
        result = meta.get("result")
        info = result if isinstance(result, dict) else {}
        call_id, tool = self._names.get(task_id, ("", ""))
        self._emit(
            "started",
            tool_call_id=call_id,
            tool=tool,
            task_id=task_id,
            worker=info.get("hostname"),
            pid=info.get("pid"),
        )

    def _progress(self, task_id: str, events: list[Any]) -> None:
        """A remote tool's own stream-writer events, tagged with its ``tool_call_id``."""
        call_id, _ = self._names.get(task_id, ("", ""))
        for event in events:
            if event == HEARTBEAT:
                continue
            data = from_wire(event)
            payload = (
                {**data, "tool_call_id": data.get("tool_call_id", call_id)}
                if isinstance(data, dict)
                else {"tool_call_id": call_id, "data": data}
            )
            self._write_payload(payload)

    def cancelled(self, call: PreparedCall) -> None:
        self._emit("cancelled", tool_call_id=call.call_id, tool=call.tool, task_id=call.task_id)

    def finished(self, call: PreparedCall, result: ToolResult) -> None:
        self._emit(
            "finished",
            tool_call_id=call.call_id,
            tool=call.tool,
            task_id=call.task_id,
            status=result.status,
            error_kind=result.error_kind,
            worker=result.worker,
            duration=result.duration,
        )
