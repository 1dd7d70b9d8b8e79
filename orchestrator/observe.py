"""One observer per remote call: what a local tool run would report, reported here.

A call the workers run never enters ``BaseTool.run`` on the orchestrator, so everything
that run would tell the world is told by :class:`CallObserver`, from one place:

- **callbacks**: ``on_tool_start`` with the tool's name, description and input, the run's
  tags and metadata, under the tools node's run; then ``on_tool_end`` with the
  ToolMessage, or ``on_tool_error`` with a :class:`RemoteToolError` carrying the text the
  model reads (what a local tool would have raised), in sync and async runs;
- **tracing**: the ``dispatch_tool <tool>`` span and the trace context the call carries
  (:mod:`orchestrator.tracing`);
- **events**: ``dispatched`` / ``started`` / ``finished`` / ``cancelled`` in the run's
  ``custom`` stream, and the tool's own progress events, tagged with its call id;
- **the call log**: one line per finished call (the worker logs its own; both carry the
  thread, run, call and task ids);
- **timings**: publication-to-start and publication-to-result per tool, for ``toolfleet
  serve``'s ``/metrics`` (:class:`~orchestrator.dispatch.timings.CallTimings`).

State changes arrive on the result listener's thread; events then write from a copy of
the caller's context (LangGraph's stream writer reads the run from a context variable).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from dataclasses import replace
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManager,
    CallbackManager,
)
from langchain_core.messages import ToolMessage
from langchain_core.tools import ToolException
from langgraph.types import Command

from orchestrator.call import CallSite, PreparedCall
from orchestrator.dispatch.timings import CallTimings
from orchestrator.dispatch.watch import PROGRESS
from orchestrator.tracing import DispatchSpan, dispatch_span, trace_context
from tool_workers.contract.models import HEARTBEAT, ToolResult
from tool_workers.contract.wire_json import from_wire

log = logging.getLogger("toolfleet.orchestrator")
calls_log = logging.getLogger("toolfleet.orchestrator.calls")

Output = ToolMessage | Command[Any]


class RemoteToolError(ToolException):
    """Reported to callback handlers when a remote tool failed; its text is the model's."""


class CallObserver:
    """Reports one remote call: callbacks, its span, its events, its log line, timings.

    Use as a context manager around the call (``with`` in sync runs, ``async with`` in
    async ones); :attr:`call` is then the call with its trace context.

    Args:
        site: Where the call was made (its run's callbacks and stream writer).
        call: The call.
        timings: The dispatcher's timings, when it keeps them.
    """

    def __init__(
        self, site: CallSite, call: PreparedCall, timings: CallTimings | None = None
    ) -> None:
        self.site = site
        self.call = call
        self._timings = timings
        self._run: Any = None
        self._span_cm: contextlib.AbstractContextManager[DispatchSpan] | None = None
        self._span: DispatchSpan | None = None
        self._write = site.writer
        # The writer reads the run from a context variable: state changes arrive on the
        # listener's thread and write from a copy of this context.
        self._context = contextvars.copy_context() if site.writer is not None else None
        self._context_lock = threading.Lock()
        self._thread = threading.current_thread()
        self._said_dispatched = False
        self._said_started = False
        self._order_lock = threading.Lock()

    # -- start and end, sync -----------------------------------------------------------

    def __enter__(self) -> CallObserver:
        manager = CallbackManager.configure(*self._configure_args())
        self._run = manager.on_tool_start(*self._start_args(), **self._start_kwargs())
        self._open_span()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[1] is not None:
            self._run.on_tool_error(exc_info[1], tool_call_id=self.call.call_id)
        self._close_span(exc_info)

    def finished(self, result: ToolResult, output: Output) -> None:
        """The call's result is in (``output`` goes into state): say so everywhere."""
        self._end(result, output)

    # -- start and end, async ----------------------------------------------------------

    async def __aenter__(self) -> CallObserver:
        manager = AsyncCallbackManager.configure(*self._configure_args())
        self._run = await manager.on_tool_start(*self._start_args(), **self._start_kwargs())
        self._open_span()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if exc_info[1] is not None:
            await self._run.on_tool_error(exc_info[1], tool_call_id=self.call.call_id)
        self._close_span(exc_info)

    async def afinished(self, result: ToolResult, output: Output) -> None:
        """Async flavour of :meth:`finished`."""
        await self._end(result, output)

    # -- what happens in between -------------------------------------------------------

    def dispatched(self) -> None:
        """The call is on the broker (said once, before anything else about it)."""
        with self._order_lock:
            if self._said_dispatched:
                return
            self._said_dispatched = True
        self._emit("dispatched")

    def cancelled(self) -> None:
        """The call was revoked: nothing waits for it any more."""
        if self._timings is not None:
            self._timings.forget(self.call.task_id)
        self._emit("cancelled")

    def on_state(self, task_id: str, state: str | None, meta: dict[str, Any]) -> None:
        """Listener callback: the call's state changed, or it reported progress."""
        if state == PROGRESS:
            self._progress(meta.get("progress") or [])
            return
        if self._timings is not None:
            self._timings.state(task_id, state)
        if state != "STARTED":
            return
        with self._order_lock:
            if self._said_started:
                return
            self._said_started = True
        # A worker can report the start before the publication returns.
        self.dispatched()
        result = meta.get("result")
        info = result if isinstance(result, dict) else {}
        self._emit("started", worker=info.get("hostname"), pid=info.get("pid"))

    def publishing(self) -> None:
        """The call is about to be published (its timings start now)."""
        if self._timings is not None:
            self._timings.publishing([self.call])

    # -- internals ---------------------------------------------------------------------

    def _configure_args(self) -> tuple[Any, ...]:
        config = self.site.config
        return (
            config.get("callbacks"),
            None,
            False,
            config.get("tags"),
            None,
            config.get("metadata"),
        )

    def _start_args(self) -> tuple[dict[str, Any], str]:
        call = self.call
        description = call.spec.description if call.spec is not None else ""
        if self.site.tool is not None:
            description = self.site.tool.description or description
        return {"name": call.tool, "description": description}, str(call.args)

    def _start_kwargs(self) -> dict[str, Any]:
        config = self.site.config
        return {
            "name": config.get("run_name"),
            "run_id": config.get("run_id"),
            "inputs": dict(self.call.args),
            "tool_call_id": self.call.call_id,
        }

    def _open_span(self) -> None:
        self._span_cm = dispatch_span(self.call)
        self._span = self._span_cm.__enter__()
        # Taken here, in the caller's thread or coroutine: publishing may happen elsewhere.
        traced = trace_context(self._run.run_id, self._run.handlers)
        if traced is not None:
            self.call = replace(self.call, trace=traced)

    def _close_span(self, exc_info: tuple[Any, ...]) -> None:
        if self._span_cm is not None:
            self._span_cm.__exit__(*exc_info)

    def _end(self, result: ToolResult, output: Output) -> Any:
        """Say the call ended, and end the callbacks' tool run: what the run manager's
        call returns (to await, on an async manager)."""
        self._finished(result, output)
        failure = _failure(output)
        if failure is not None:
            return self._run.on_tool_error(failure, tool_call_id=self.call.call_id)
        return self._run.on_tool_end(output, name=self.call.tool)

    def _finished(self, result: ToolResult, output: Output) -> None:
        call = self.call
        if self._timings is not None:
            self._timings.forget(call.task_id)
        self._emit(
            "finished",
            status=result.status,
            error_kind=result.error_kind,
            worker=result.worker,
            duration=result.duration,
        )
        if self._span is not None:
            self._span.finished(output)
        if calls_log.isEnabledFor(logging.INFO):
            calls_log.info(
                "tool call finished",
                extra={
                    "toolfleet": {
                        "side": "orchestrator",
                        "tool": call.tool,
                        "tool_call_id": call.call_id,
                        "thread_id": call.thread_id,
                        "run_id": call.run_id,
                        "task_id": call.task_id,
                        "worker": result.worker,
                        "duration_ms": round(result.duration * 1000, 3),
                        "outcome": result.error_kind or "success",
                    }
                },
            )

    def _emit(self, event: str, **fields: Any) -> None:
        if self._write is None:
            return
        call = self.call
        self._write_payload(
            {
                "toolfleet": {
                    "event": event,
                    "ts": time.time(),
                    "tool_call_id": call.call_id,
                    "tool": call.tool,
                    "task_id": call.task_id,
                    **fields,
                }
            }
        )

    def _progress(self, events: list[Any]) -> None:
        """A remote tool's own stream-writer events, tagged with its ``tool_call_id``."""
        call_id = self.call.call_id
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

    def _write_payload(self, payload: Any) -> None:
        write = self._write
        if write is None:
            return
        try:
            if threading.current_thread() is self._thread or self._context is None:
                write(payload)
            else:
                with self._context_lock:
                    self._context.run(write, payload)
        except Exception:  # progress reporting never fails a call
            log.debug("could not write a tool-call event", exc_info=True)


def _failure(output: Output) -> RemoteToolError | None:
    """What a local tool would have raised for this output, if anything."""
    if not isinstance(output, ToolMessage) or output.status != "error":
        return None
    meta = output.response_metadata.get("toolfleet") or {}
    return RemoteToolError(str(output.content)) if meta.get("error_kind") else None
