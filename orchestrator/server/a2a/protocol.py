"""A2A's JSON-RPC codes, limits and states, its two dialects' spellings, and the checks
of a call's parameters."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from orchestrator.server.schemas import NewId

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
TASK_NOT_FOUND, NOT_CANCELABLE, UNSUPPORTED, CONTENT_NOT_SUPPORTED = -32001, -32002, -32004, -32005

MAX_CONTEXTS = 1000
"""Most threads ``ListTasks`` looks through without a ``contextId`` (the latest)."""

MAX_RUNS = 1000
"""Most runs of one thread read to find its tasks (the latest)."""

MAX_HISTORY = 10
"""Most messages a client may ask a task's history to be cut to (``historyLength``)."""

ALIASES = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}
"""The A2A 0.3 method names (what the a2a-sdk client sends), by their 1.0 names."""
METHODS = {*ALIASES.values(), "ListTasks"}

MODES = ["application/json", "text/plain"]
STATES = {
    "pending": "TASK_STATE_SUBMITTED",
    "running": "TASK_STATE_WORKING",
    "success": "TASK_STATE_COMPLETED",
    "interrupted": "TASK_STATE_CANCELED",  # a cancelled run (a graph's interrupt is a success)
    "error": "TASK_STATE_FAILED",
    "timeout": "TASK_STATE_FAILED",
}
TERMINAL = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}


THREAD_ID: TypeAdapter[str] = TypeAdapter(NewId)
"""A ``contextId``: a thread id as ``POST /threads`` takes one."""


class RpcError(Exception):
    """A JSON-RPC error answered to the call."""

    def __init__(self, code: int, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        """The HTTP status a card request refused so is answered with."""


def valid_id(rpc_id: Any) -> bool:
    return rpc_id is None or (
        isinstance(rpc_id, str | int | float) and not isinstance(rpc_id, bool)
    )


LEGACY_ROLES = {"ROLE_USER": "user", "ROLE_AGENT": "agent"}
LEGACY_STATES = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_CANCELED": "canceled",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_REJECTED": "rejected",
    "TASK_STATE_AUTH_REQUIRED": "auth-required",
}


def as_legacy(value: Any) -> Any:
    """``value`` in A2A 0.3's spelling: lowercase roles and states."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "role" and isinstance(item, str):
                out[key] = LEGACY_ROLES.get(item, item)
            elif key == "state" and isinstance(item, str):
                out[key] = LEGACY_STATES.get(item, item)
            else:
                out[key] = as_legacy(item)
        return out
    if isinstance(value, list):
        return [as_legacy(v) for v in value]
    return value


def task_params(params: dict[str, Any]) -> tuple[str, str | None]:
    task_id, context_id = params.get("id"), params.get("contextId")
    if not task_id:
        raise RpcError(INVALID_PARAMS, "Missing required parameter: id (task_id)")
    if not isinstance(task_id, str) or (context_id is not None and not isinstance(context_id, str)):
        raise RpcError(INVALID_PARAMS, "Task id and contextId must be strings")
    return task_id, context_id


def read_history_length(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RpcError(INVALID_PARAMS, "historyLength must be a non-negative integer")
    if value > MAX_HISTORY:
        raise RpcError(INVALID_PARAMS, f"historyLength cannot exceed {MAX_HISTORY}")
    return value
