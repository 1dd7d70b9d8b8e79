"""Names both sides agree on: tasks, queues, task ids, Redis keys and channels.

Every Redis key and channel toolfleet's core uses is built here, from the
deployment's key prefix (``settings.key_prefix``).
"""

from __future__ import annotations

import re
import uuid

DEFAULT_QUEUE = "tools"
"""Queue a tool is routed to unless its policy names another."""

TASK_PREFIX = "tools."
"""Every tool's Celery task is named ``tools.<tool name>``."""

_TASK_ID_NAMESPACE = uuid.UUID("6b1f6d2e-54a4-4c52-9e0a-6f0f3c7d2a11")


def task_name(tool: str) -> str:
    """Celery task name of a tool."""
    return f"{TASK_PREFIX}{tool}"


def tool_from_task(name: str) -> str | None:
    """Tool name of a toolfleet task name, or ``None`` for other tasks."""
    return name[len(TASK_PREFIX) :] if name.startswith(TASK_PREFIX) else None


TOOL_QUEUE_PREFIX = "tool:"
"""Every tool queue's name starts with this (``tool:<tool>:<schema version>``)."""


VERSION_HEADER = "toolfleet_version"
"""Message header: the schema version of the tool the call was made with."""

HOPS_HEADER = "toolfleet_hops"
"""Message header: how many times workers that do not serve the call handed it on."""

MAX_HOPS = 3
"""A call handed on this many times is answered with an error instead."""

_ROUTABLE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def tool_queue(tool: str, version: str) -> str | None:
    """The queue of a tool at one schema version: only workers serving the tool at that
    version consume it, so a call routed by tool reaches only such a worker. ``None`` for
    a name no broker queue should carry (not letters, digits, ``_.-``, or over 128)."""
    if not _ROUTABLE.fullmatch(tool) or not _ROUTABLE.fullmatch(version):
        return None
    return f"{TOOL_QUEUE_PREFIX}{tool}:{version}"


def tool_of_queue(queue: str) -> str | None:
    """The tool a tool queue carries (``None``: not a tool queue)."""
    if not queue.startswith(TOOL_QUEUE_PREFIX):
        return None
    tool, sep, _ = queue[len(TOOL_QUEUE_PREFIX) :].rpartition(":")
    return tool if sep and tool else None


def call_key(thread_id: str | None, message_id: str | None, call_id: str) -> str:
    """The identity of one tool call: its ``tool_call_id`` within its AIMessage and thread.

    The AIMessage id is part of it because some model providers reuse short call ids
    (``call_0``) on every turn; two turns of one thread must not share a task.
    """
    return f"{thread_id or ''}\x1f{message_id or ''}\x1f{call_id}"


def task_id_for(key: str) -> str:
    """Deterministic Celery task id of a call key (also the call's idempotency key)."""
    return str(uuid.uuid5(_TASK_ID_NAMESPACE, key))


REPLY_CHANNEL_MARK = "toolfleet:reply:"
"""Reply channels contain this; other ``reply_to`` values (Celery's defaults) are ignored."""


def reply_channel(key_prefix: str, token: str) -> str:
    """The channel one orchestrator process hears every state and progress batch on."""
    return f"{key_prefix}reply:{token}"


def late_key(key_prefix: str, task_id: str) -> str:
    """Where a call's *late* result is kept: the result of an attempt that finished after
    the call was handed on to another attempt (its store was refused by the fence)."""
    return f"{key_prefix}late:{task_id}"


LATE_FIELD = "late_at"
"""Field of a late-result record (and of its notice on the reply channel): when it came."""


def lost_key(key_prefix: str, thread_id: str) -> str:
    """Hash of a thread's calls answered as lost (task id -> the call), whose late result
    may still come."""
    return f"{key_prefix}lost:{thread_id}"


def placement_key(key_prefix: str, host: str, pid: int) -> str:
    """Where one orchestrator process publishes its agents' tool placement."""
    return f"{key_prefix}placement:{host}:{pid}"


def placement_pattern(key_prefix: str) -> str:
    """``SCAN`` pattern matching every orchestrator's placement key."""
    return f"{key_prefix}placement:*"


def server_key_prefix(key_prefix: str) -> str:
    """Prefix of every key of the HTTP service (see :mod:`orchestrator.server.keys`)."""
    return f"{key_prefix}server:"


def worker_registry_key(key_prefix: str, worker: str) -> str:
    """Redis key where one worker publishes the tools it serves."""
    return f"{key_prefix}workers:{worker}"


REGISTRY_TTL_REFRESHES = 3
"""A worker's registry entry (and its note in ``worker-processes``) outlives this many
refresh intervals without a refresh."""


def worker_processes_key(key_prefix: str, worker: str) -> str:
    """Redis sorted set of the processes (``host:pid``) refreshing one node name's entry,
    scored by their last refresh: more than one fresh member is two workers of one name."""
    return f"{key_prefix}worker-processes:{worker}"


def worker_registry_pattern(key_prefix: str) -> str:
    """``SCAN`` pattern matching every worker's registry key."""
    return f"{key_prefix}workers:*"


RESULT_KEY_PREFIX = "celery-task-meta-"
"""Celery's Redis result backend keeps a task's state under this and its task id."""


def broker_prefix(namespace: str) -> str:
    """The key prefix kombu and Celery put before their Redis keys (``global_keyprefix``)."""
    return f"{namespace}:" if namespace else ""


def result_key(namespace: str, task_id: str) -> str:
    """The Redis key of a call's Celery result (``celery-task-meta-<id>``, namespaced)."""
    return f"{broker_prefix(namespace)}{RESULT_KEY_PREFIX}{task_id}"


def queue_key(namespace: str, queue: str) -> str:
    """The Redis list a queue's messages wait on (kombu's Redis transport, default
    priority)."""
    return f"{broker_prefix(namespace)}{queue}"
