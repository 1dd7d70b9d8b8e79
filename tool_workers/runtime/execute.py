"""Run one tool call with ToolNode's semantics and turn the outcome into a ToolResult.

Nothing here knows about Celery tasks: the task in :mod:`tool_workers.runtime.tasks` calls
:func:`run_call`, and the in-process dispatcher of the orchestrator's tests calls it too.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolInvocationError, msg_content_output
from langgraph.types import Command, Send
from pydantic import ValidationError

from tool_workers.celery_ext.soft_limit import tool_window
from tool_workers.contract.connections import mask_secrets
from tool_workers.contract.models import ToolRequest, ToolResult, error_text, timeout_text
from tool_workers.contract.wire_json import NotJSONError, to_wire
from tool_workers.observability.trace_parent import parented_config
from tool_workers.runtime.context import CallContext, call_scope
from tool_workers.runtime.injection import MissingContextError, WorkerGraph, inject, invoke_config

TRUNCATION_NOTE = "\n[toolfleet: result truncated from {size} to {limit} bytes]"

TRACEBACK_CHARS = 8_000
"""The end of a tool's traceback a failed task keeps (the frames nearest the error)."""

_raised: ContextVar[BaseException | None] = ContextVar("toolfleet_tool_raised", default=None)
"""What the tool of the call last run in this context raised (``None``: it did not)."""


class ToolTraceback(Exception):
    """The tool's own traceback, as text with secrets masked: the cause of a failed task,
    so Flower shows the line of the tool that failed, not only toolfleet's ``raise``."""


def tool_traceback() -> ToolTraceback | None:
    """The traceback of what the tool of the last call run here raised, or ``None``."""
    exc = _raised.get()
    if exc is None:
        return None
    text = "".join(traceback.format_exception(exc)).rstrip()
    if len(text) > TRACEBACK_CHARS:
        text = "...\n" + text[-TRACEBACK_CHARS:]
    return ToolTraceback("the tool's own traceback:\n" + mask_secrets(text))


@dataclass(frozen=True, slots=True)
class Limits:
    """Byte and time limits one call runs under."""

    max_arg_bytes: int = 1_000_000
    max_result_bytes: int = 1_000_000
    soft_time_limit: float | None = None


class TransientToolError(Exception):
    """Raised by :func:`run_call` when the tool failed in a way its policy retries."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (raises TypeError/ValueError if not JSON)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def run_call(
    tool: BaseTool,
    request: ToolRequest,
    *,
    worker: str = "",
    attempt: int = 1,
    limits: Limits = Limits(),
    transient: tuple[type[BaseException], ...] = (),
    graph: WorkerGraph | None = None,
) -> ToolResult:
    """Run ``request`` on ``tool`` and return the result; tool failures become error results.

    Args:
        tool: The LangChain tool to run.
        request: The call, as received from the wire.
        worker: Name of the worker node, recorded in the result.
        attempt: 1-based attempt number (Celery retries raise it).
        limits: Byte limits and the soft time limit (named in timeout messages).
        transient: Exception types the tool's policy retries.
        graph: The worker's store and the call's stream writer, for injected arguments.

    Returns:
        The result: content, artifact, status and where and how long it ran.

    Raises:
        TransientToolError: the tool raised one of ``transient``; the caller retries.
    """
    base = {"worker": worker, "pid": os.getpid()}
    _raised.set(None)
    try:
        arg_bytes = json_size(request.args)
    except (TypeError, ValueError) as exc:
        return ToolResult.error("protocol", error_text(exc), **base)
    if arg_bytes > limits.max_arg_bytes:
        return ToolResult.error(
            "too_large",
            f"Error: the arguments of '{request.tool}' are {arg_bytes} bytes, over the "
            f"limit of {limits.max_arg_bytes} bytes.\n Please fix your mistakes.",
            **base,
        )

    graph = graph or WorkerGraph()
    config = invoke_config(request, graph)
    try:
        args = inject(tool, request, graph, config)
    except (MissingContextError, NotJSONError) as exc:
        return ToolResult.error(
            "context", f"Error: tool '{request.tool}' cannot run: {exc}.", **base
        )
    call = {"type": "tool_call", "name": tool.name, "args": args, "id": request.call_id}
    ctx = CallContext(
        call_id=request.call_id,
        idempotency_key=request.idempotency_key,
        thread_id=request.thread_id,
        run_id=request.run_id,
        attempt=attempt,
    )
    started = time.time()
    t0 = time.perf_counter()
    timing = {**base, "started_at": started}
    try:
        with call_scope(ctx), tool_window(limits.soft_time_limit):
            output = _invoke(tool, call, parented_config(config, request.trace))
    except SoftTimeLimitExceeded:
        return ToolResult.error(
            "timeout",
            timeout_text(tool.name, limits.soft_time_limit),
            duration=time.perf_counter() - t0,
            **timing,
        )
    except ValidationError as exc:
        invocation = ToolInvocationError(
            tool.name, exc, request.args, exc.errors(include_url=False)
        )
        return ToolResult.error(
            "invalid_args", invocation.message, duration=time.perf_counter() - t0, **timing
        )
    except transient as exc:
        raise TransientToolError(exc) from exc
    except Exception as exc:
        _raised.set(exc)
        return ToolResult.error(
            "tool_error", error_text(exc), duration=time.perf_counter() - t0, **timing
        )
    duration = time.perf_counter() - t0
    return _to_result(tool.name, output, limits, duration=duration, **timing)


def _invoke(tool: BaseTool, call: dict[str, Any], config: RunnableConfig) -> Any:
    """Run the tool; a tool written as ``async def`` runs on an event loop of its own."""
    if getattr(tool, "func", True) is None and getattr(tool, "coroutine", None) is not None:
        return asyncio.run(tool.ainvoke(call, config))
    return tool.invoke(call, config)


def _to_result(name: str, output: Any, limits: Limits, **timing: Any) -> ToolResult:
    if isinstance(output, Command):
        return _command_result(name, output, limits, **timing)
    if not isinstance(output, ToolMessage):
        return ToolResult.error(
            "bad_result",
            f"Error: tool '{name}' returned {type(output).__name__}, which cannot cross "
            "the wire (expected content or a ToolMessage).\n Please fix your mistakes.",
            **timing,
        )
    content = msg_content_output(output.content)
    try:
        artifact_bytes = 0 if output.artifact is None else json_size(output.artifact)
    except (TypeError, ValueError) as exc:
        return ToolResult.error(
            "bad_result",
            f"Error: the artifact of tool '{name}' is not JSON ({exc}).\n"
            " Please fix your mistakes.",
            **timing,
        )
    if artifact_bytes > limits.max_result_bytes:
        # An artifact cannot be cut like text: refused whole, before it crosses the wire.
        return ToolResult.error(
            "too_large",
            f"Error: the artifact of '{name}' is {artifact_bytes} bytes, over the limit of "
            f"{limits.max_result_bytes} bytes.\n Please fix your mistakes.",
            **timing,
        )
    # Content and artifact share the limit: the content gets what the artifact leaves.
    truncated = _truncate(content, limits.max_result_bytes - artifact_bytes)
    if truncated is None:
        return ToolResult.error(
            "too_large",
            f"Error: the result of '{name}' is over the limit of "
            f"{limits.max_result_bytes} bytes.\n Please fix your mistakes.",
            **timing,
        )
    return ToolResult(
        status="error" if output.status == "error" else "success",
        error_kind="tool_error" if output.status == "error" else None,
        content=truncated,
        artifact=output.artifact,
        **timing,
    )


def _command_result(name: str, command: Command[Any], limits: Limits, **timing: Any) -> ToolResult:
    """A tool's ``Command`` as JSON: ``update`` (messages included) and ``goto``."""
    if command.graph is not None or command.resume is not None:
        return ToolResult.error(
            "bad_result",
            f"Error: tool '{name}' returned a Command with graph or resume, which a remote "
            "tool cannot use (only update and goto).\n Please fix your mistakes.",
            **timing,
        )
    goto = command.goto
    names: Iterable[Any] = [goto] if isinstance(goto, (str, Send)) else goto
    if not all(isinstance(g, str) for g in names):
        return ToolResult.error(
            "bad_result",
            f"Error: tool '{name}' returned a Command whose goto is not node names.\n"
            " Please fix your mistakes.",
            **timing,
        )
    try:
        update = to_wire(command.update, "Command.update")
    except NotJSONError as exc:
        return ToolResult.error("bad_result", f"Error: tool '{name}' returned {exc}.", **timing)
    update_bytes = json_size(update)
    if update_bytes > limits.max_result_bytes:
        return ToolResult.error(
            "too_large",
            f"Error: the Command update of '{name}' is {update_bytes} bytes, over the limit "
            f"of {limits.max_result_bytes} bytes.\n Please fix your mistakes.",
            **timing,
        )
    return ToolResult(
        command={"update": update, "goto": goto if isinstance(goto, str) else list(names)},
        content="",
        **timing,
    )


def _truncate(content: str | list[Any], limit: int) -> str | list[Any] | None:
    """Cut string content to ``limit`` bytes with a note; ``None`` if blocks are too big."""
    if isinstance(content, str):
        data = content.encode()
        if len(data) <= limit:
            return content
        kept = data[:limit].decode(errors="ignore")
        return kept + TRUNCATION_NOTE.format(size=len(data), limit=limit)
    try:
        size = json_size(content)
    except (TypeError, ValueError):
        return None
    return content if size <= limit else None
