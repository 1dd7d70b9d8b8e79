"""Every ToolMessage toolfleet writes itself, and the texts the model reads in them.

A worker's result becomes a ToolMessage in :func:`result_message`, as a local ``ToolNode``
would have built it. Everything else toolfleet answers in a call's place (a call it could
not send, a tool no worker serves, arguments that are not JSON, a call a cancelled run
left unanswered) is an error ToolMessage from :func:`error_message`, with its
``error_kind`` in ``response_metadata["toolfleet"]``; the texts are here, in one place.

Texts of failures the *worker* reports (a tool that raised, a time limit) are shared
with the workers: :func:`tool_workers.contract.error_text` and
:func:`~tool_workers.contract.timeout_text`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE
from langgraph.types import Command

from orchestrator.call import PreparedCall, answered_ids, messages_of
from tool_workers.contract.models import ErrorKind, ToolResult
from tool_workers.contract.signing import Problem
from tool_workers.contract.wire_json import from_wire

log = logging.getLogger("toolfleet.orchestrator")

FIX = "\n Please fix your mistakes."
"""How a text asks the model to correct its call (as LangGraph's own texts do)."""


def error_message(name: str, call_id: str | None, kind: ErrorKind, content: str) -> ToolMessage:
    """An error ToolMessage answering the call ``call_id`` to ``name``."""
    return ToolMessage(
        content=content,
        name=name,
        tool_call_id=call_id or "",
        status="error",
        response_metadata={"toolfleet": {"error_kind": kind}},
    )


def result_message(call: PreparedCall, result: ToolResult) -> ToolMessage:
    """The ToolMessage for a call's result, as a local ToolNode would have built it."""
    return ToolMessage(
        content=result.content,
        artifact=result.artifact,
        status=result.status,
        name=call.tool,
        tool_call_id=call.call_id,
        response_metadata={
            "toolfleet": {
                "task_id": call.task_id,
                "worker": result.worker,
                "pid": result.pid,
                "duration": result.duration,
                "error_kind": result.error_kind,
            }
        },
    )


def command_from(result_command: dict[str, Any], tool: str, call_id: str) -> Command[Any]:
    """The ``Command`` a remote tool returned, checked as ToolNode checks a local one.

    Raises:
        ValueError: its update carries no ToolMessage answering this call (ToolNode's rule).
    """
    update = from_wire(result_command.get("update"))
    goto = result_command.get("goto") or ()
    messages = update.get("messages") if isinstance(update, dict) else None
    if isinstance(messages, list) and not any(
        isinstance(m, ToolMessage) and m.tool_call_id == call_id for m in messages
    ):
        raise ValueError(
            f"Expected to have a matching ToolMessage in Command.update for tool '{tool}', "
            f"got: {messages}. Every tool call (LLM requesting to call a tool) in the "
            "message history MUST have a corresponding ToolMessage."
        )
    return Command(update=update, goto=goto)


# -- texts of calls answered here -------------------------------------------------------


def unknown_tool_text(name: str, available: Iterable[str]) -> str:
    """A call to a tool nobody knows (LangGraph's own wording)."""
    return INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
        requested_tool=name, available_tools=", ".join(sorted(available))
    )


def unserved_text(name: str, waited: float) -> str:
    """A call to a tool no live worker serves, after waiting ``waited`` seconds."""
    return (
        f"Error: no worker serves the tool '{name}' right now (waited {waited:g} s).\n"
        " Try again later or use another tool."
    )


def not_sendable_text(reason: object) -> str:
    """A call whose graph context cannot cross the wire."""
    return f"Error: cannot send this call: {reason}."


def invalid_json_text(name: Any, error: Any, args: Any) -> str:
    """A call whose arguments are not valid JSON (``AIMessage.invalid_tool_calls``)."""
    return (
        f"Error: the arguments of your call to '{name}' are not valid JSON "
        f"({error or 'unparseable'}): {args!r}{FIX}"
    )


def not_completed_text(name: str, reason: str) -> str:
    """A call a stopped run left without an answer (it may have been sent, and run)."""
    return (
        f"Error: no result of the call to '{name}' arrived: {reason}. It may have run, in "
        "part or in full: check whether it took effect before calling it again."
    )


# -- texts of results the orchestrator writes for calls that never returned --------------


def hung_text(tool: str, idle: float) -> str:
    """A started call silent for longer than its idle timeout."""
    return (
        f"Error: the tool '{tool}' showed no progress for {idle:g} s (its idle "
        f"timeout) and was stopped.{FIX}"
    )


def cancelled_text(tool: str) -> str:
    """A call revoked before it finished."""
    return f"Error: the call to '{tool}' was cancelled before it finished."


def bad_result_text(tool: str, errors: int) -> str:
    """A worker's SUCCESS whose payload is not a toolfleet result."""
    return (
        f"Error: the worker's result for '{tool}' is not a toolfleet result "
        f"({errors} error(s)).{FIX}"
    )


def refused_result_text(tool: str, problem: Problem) -> str:
    """A result refused for its signature (``TOOLFLEET_SIGNING_KEY`` set here)."""
    what = "is not signed" if problem == "unsigned" else "has a signature that does not match"
    return (
        f"Error: the result of the call to '{tool}' was refused: it {what}, and this "
        "orchestrator only accepts results signed with TOOLFLEET_SIGNING_KEY (forged, or "
        "from a worker without the key). Whether the tool ran is unknown."
    )


def not_served_there_text(tool: str) -> str:
    """A call the worker that received it does not serve (Celery's NotRegistered)."""
    return (
        f"Error: {tool} is not a valid tool: the worker that received the call does not "
        f"serve it.{FIX}"
    )


def not_served_text(tool: str, detail: str) -> str:
    """A call no live worker serves, answered by the worker that received it."""
    return f"Error: {tool} could not run: {detail}.{FIX}"


def unreadable_text(tool: str, detail: str) -> str:
    """A call whose message the worker could not read."""
    return f"Error: the worker could not read the call to '{tool}': {detail}{FIX}"


def worker_lost_text(tool: str, detail: str) -> str:
    """A call whose worker died and which could not be run again."""
    return (
        f"Error: the worker running '{tool}' stopped ({detail}) before the call finished, "
        "and the call was not run again. It may have run in part: check whether it took "
        "effect before calling it again."
    )


def undelivered_text(tool: str, detail: str) -> str:
    """A call whose worker lost its link to Redis and could not store the call's result."""
    return (
        f"Error: the worker running '{tool}' lost its connection to Redis ({detail}) and "
        "could not deliver the call's result. The tool may have run, in part or in full, "
        "and the call was not retried: check whether it took effect before calling it "
        "again."
    )


def answer_invalid_calls(state: Any) -> dict[str, Any] | None:
    """Error ToolMessages for the last AIMessage's ``invalid_tool_calls`` (state update).

    Jumps back to the model when the message made no valid call.
    """
    messages = messages_of(state)
    last = messages[-1] if messages else None
    if not isinstance(last, AIMessage) or not last.invalid_tool_calls:
        return None
    answered = answered_ids(state)
    errors = [
        error_message(
            bad.get("name") or "invalid_tool_call",
            bad["id"],
            "invalid_args",
            invalid_json_text(bad.get("name"), bad.get("error"), bad.get("args")),
        )
        for bad in last.invalid_tool_calls
        if bad.get("id") and bad["id"] not in answered
    ]
    if not errors:
        return None
    log.warning("%d tool call(s) with malformed arguments answered with errors", len(errors))
    update: dict[str, Any] = {"messages": errors}
    if not last.tool_calls:
        update["jump_to"] = "model"
    return update


def answer_pending(calls: Iterable[Mapping[str, Any]], reason: str) -> list[ToolMessage]:
    """Error ToolMessages for calls a stopped run left unanswered."""
    return [
        error_message(
            call["name"], call["id"], "cancelled", not_completed_text(call["name"], reason)
        )
        for call in calls
    ]
