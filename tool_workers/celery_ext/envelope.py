"""What a task message must look like before Celery's worker code reads it.

Celery's worker trusts the shape of a task message: its ``Request`` unpacks the body
into three items, unpacks the ``timelimit`` header into two, and reads the ``id`` header
by key, in the consumer's own process. A hand-made message that breaks one of these
raises there, and the worker either exits (``Unrecoverable error``) or restarts its
consumer in a loop, while the message goes back on the queue for the next worker.

:func:`check_message` looks at every header and the body the way Celery will, before
Celery does, and says what is wrong. It accepts exactly the messages toolfleet's own
orchestrator (and Celery's retries of its calls) publish: task protocol 2, JSON, a body
of ``[args, kwargs, embed]`` with no callbacks, chords or chains.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tool_workers.contract.names import TASK_PREFIX, tool_from_task

MAX_TASK_ID_CHARS = 200
"""A task id longer than this (toolfleet's are 36-character UUIDs) is not used as a key."""

_TASK_ID = re.compile(rf"[!-~]{{1,{MAX_TASK_ID_CHARS}}}")
"""Printable ASCII without spaces: safe in a Redis key, a log line and a channel name."""

_EMBED_KEYS = frozenset({"callbacks", "errbacks", "chain", "chord"})
"""The keys of a protocol 2 body's third item; Celery merges the item into the request
context, so any other key would overwrite the call's own context (its id, reply channel)."""

_OPTIONAL_TEXT_HEADERS = ("shadow", "root_id", "parent_id", "group", "argsrepr", "kwargsrepr")


@dataclass(frozen=True)
class Refusal:
    """Why a task message is not handed to Celery, and whom to answer."""

    reason: str
    """What is wrong, naming the header or body part (never its value: it may hold secrets)."""
    task_id: str | None
    """The message's task id when it is usable as a result key, else ``None``."""
    task: str | None
    """The task name the message asks for, when it is a string."""


def usable_task_id(value: Any) -> str | None:
    """``value`` if it can name a call's result (a short printable string), else ``None``."""
    return value if isinstance(value, str) and _TASK_ID.fullmatch(value) else None


def check_message(message: Any) -> Refusal | None:
    """What is wrong with a task message, or ``None`` when Celery may read it.

    Args:
        message: A kombu message from a task queue. Its body is decoded here (kombu
            caches the result, so Celery does not decode it again).

    Returns:
        A :class:`Refusal`, or ``None`` for a message of the shape toolfleet sends.
    """
    headers = message.headers
    if not isinstance(headers, dict):
        return Refusal("the message has no headers", None, None)
    task_id = usable_task_id(headers.get("id"))
    name = headers.get("task")
    task = name if isinstance(name, str) else None

    def refuse(reason: str) -> Refusal:
        return Refusal(reason, task_id, task)

    if "id" not in headers:
        return refuse("the message has no 'id' header")
    if task_id is None:
        return refuse(
            f"the 'id' header is not a task id (1 to {MAX_TASK_ID_CHARS} printable characters)"
        )
    if task is None:
        return refuse("the 'task' header is missing or not a string (task protocol 2 only)")
    if tool_from_task(task) is None:
        # Celery registers its own tasks (celery.chord_unlock, celery.backend_cleanup,
        # celery.accumulate, ...) in every worker; a tool worker runs tool calls only.
        return refuse(f"the task is not a tool call ({TASK_PREFIX}<tool>); it was not run")
    problem = _header_problem(headers)
    if problem is not None:
        return refuse(problem)
    try:
        body = message.decode()
    except Exception as exc:  # any decoder, any codec: the reason names its type only
        return refuse(
            f"the body could not be decoded ({type(exc).__name__}; content type "
            f"{_short(message.content_type)}, encoding {_short(message.content_encoding)})"
        )
    problem = _body_problem(body)
    return refuse(problem) if problem is not None else None


def _header_problem(headers: dict[str, Any]) -> str | None:
    timelimit = headers.get("timelimit")
    if timelimit is not None and not (
        isinstance(timelimit, (list, tuple))
        and len(timelimit) == 2
        and all(limit is None or _is_seconds(limit) for limit in timelimit)
    ):
        return "the 'timelimit' header is not a [hard, soft] pair of seconds or nulls"
    retries = headers.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        return "the 'retries' header is not a non-negative integer"
    for key in ("eta", "expires"):
        if headers.get(key) is not None and not isinstance(headers[key], str):
            return f"the {key!r} header is not an ISO 8601 string"
    for key in _OPTIONAL_TEXT_HEADERS:
        if headers.get(key) is not None and not isinstance(headers[key], str):
            return f"the {key!r} header is not a string"
    if headers.get("ignore_result") not in (None, False):
        # A waiter reads the stored result: a tool call without one would never end.
        return "the 'ignore_result' header is set (a tool call's result is always stored)"
    return None


def _body_problem(body: Any) -> str | None:
    if not isinstance(body, (list, tuple)) or len(body) != 3:
        return "the body is not a JSON list of [args, kwargs, embed]"
    args, kwargs, embed = body
    if not isinstance(args, (list, tuple)):
        return "the body's args are not a list"
    if not isinstance(kwargs, dict):
        return "the body's kwargs are not an object"
    if embed is not None and not isinstance(embed, dict):
        return "the body's embed is not an object"
    for key, value in (embed or {}).items():
        if key not in _EMBED_KEYS:
            return "the body's embed has a key other than callbacks, errbacks, chain, chord"
        if value:
            return "the message carries callbacks, a chain or a chord (tool calls have none)"
    return None


def _is_seconds(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


WORKER_DECIDES = ("eta", "countdown", "timelimit")
"""Celery headers whose say the worker's own policy takes: a call runs when it arrives
(toolfleet never schedules one ahead) under its tool's time limits."""


def pin_headers(headers: dict[str, Any], signed: bool) -> None:
    """Drop the headers of a checked message that would let whoever wrote it change when
    or for how long the call runs (:data:`WORKER_DECIDES`); on a fleet with a signing key
    also ``expires``, which the signature does not cover (the signed request carries the
    deadline instead, ``expires_at``)."""
    for name in WORKER_DECIDES:
        headers.pop(name, None)
    if signed:
        headers.pop("expires", None)
