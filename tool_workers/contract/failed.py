"""A call that ended in an error result is a failed Celery task: what Flower lists as failed.

The worker seals the call's result as for a success, then raises one of these with the
result as its second argument (``throws``: Celery logs it in one line, no traceback).
Celery stores the task as FAILURE, its exception as JSON (``exc_type``, ``exc_module``
and ``exc_message``, the exception's arguments), and sends ``task-failed`` with the
exception's repr: Flower shows the call under Failed with the type and a short message.
The orchestrator takes the result back out of the stored or published state
(:func:`result_of_failure`) and reads it as it reads a success's: the model gets the
same error ToolMessage either way.

::

    ToolCallFailed           a call's error result, as a failed task
     +-- ToolError           the tool raised, returned an error, or could not run as asked
     +-- ToolTimeout         it ran past its time limit, or made no progress
     +-- ToolRefused         a worker refused to run it (or to run it again)
"""

from __future__ import annotations

from typing import Any

from tool_workers.contract.masking import mask_text

SHOWN_CHARS = 80
"""Characters of an error's text a failed task shows (its repr in Flower's exception
column and the log line; the model gets the whole text). Short enough for the Tasks page
to fit a 1,600 px screen."""


class ToolCallFailed(Exception):
    """Raised by a tool task whose call ended in an error result (the result rides along).

    Args:
        message: What Flower and the worker's log show.
        result: The call's result as it crosses the wire (sealed when signing is on).
    """

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message, result)

    @property
    def message(self) -> str:
        """What Flower and the worker's log show."""
        return str(self.args[0])

    @property
    def result(self) -> dict[str, Any]:
        """The call's result as it crosses the wire."""
        result = self.args[1]
        return result if isinstance(result, dict) else {}

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class ToolError(ToolCallFailed):
    """Raised when the tool raised, returned an error, or could not run as asked."""


class ToolTimeout(ToolCallFailed):
    """Raised when the tool ran past its time limit or made no progress."""


class ToolRefused(ToolCallFailed):
    """Raised when a worker refused to run the call, or to run it again."""


FAILED_TYPES: dict[str, type[ToolCallFailed]] = {
    cls.__qualname__: cls for cls in (ToolCallFailed, ToolError, ToolTimeout, ToolRefused)
}
"""The exception types a failed call is stored as, by the name Celery stores."""

_TIMEOUTS = frozenset({"timeout", "hung"})
_SAID_BY_TYPE = frozenset({"tool_error", "timeout"})
"""Error kinds the exception's type names (ToolError, ToolTimeout) without more."""
_REFUSALS = frozenset(
    {"protocol", "redelivered", "cancelled", "worker_lost", "unknown_tool", "unserved"}
)


def shown_message(result: dict[str, Any]) -> str:
    """A short line for an error result: the first line of its text without its
    ``Error:``, after the error kind where the exception's type does not say it, URL
    passwords masked (an ``invalid_args`` text quotes the arguments: not shown)."""
    kind = str(result.get("error_kind") or "tool_error")
    if kind == "invalid_args":
        return f"{kind}: the arguments do not match the tool's schema"
    content = result.get("content")
    text = content if isinstance(content, str) else "the tool returned error content blocks"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = first.removeprefix("Error:").strip()
    line = mask_text(first if kind in _SAID_BY_TYPE else f"{kind}: {first}")
    return line if len(line) <= SHOWN_CHARS else line[: SHOWN_CHARS - 3] + "..."


def failure_of(result: dict[str, Any]) -> ToolCallFailed:
    """The exception a tool task raises for the error result ``result`` (wire form)."""
    kind = result.get("error_kind")
    cls = ToolTimeout if kind in _TIMEOUTS else ToolRefused if kind in _REFUSALS else ToolError
    return cls(shown_message(result), result)


def result_of_failure(payload: Any) -> dict[str, Any] | None:
    """The call's result a stored FAILURE carries, or ``None`` if it is another failure.

    Args:
        payload: The ``result`` of a FAILURE state, as Celery's JSON serializer stores an
            exception (``exc_type``, ``exc_module``, ``exc_message``) or, decoded by
            Celery's backend, the exception itself.
    """
    if isinstance(payload, ToolCallFailed):
        return payload.result or None
    if not isinstance(payload, dict):
        return None
    if payload.get("exc_module") != __name__ or payload.get("exc_type") not in FAILED_TYPES:
        return None
    message = payload.get("exc_message")
    if not isinstance(message, (list, tuple)) or len(message) != 2:
        return None
    result = message[1]
    return result if isinstance(result, dict) else None
