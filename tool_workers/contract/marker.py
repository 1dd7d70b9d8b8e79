"""A call's marker: the one Redis key toolfleet keeps per call, beside Celery's result.

``<prefix>call:<task id>`` holds a small JSON object that both sides write, each in a
Lua script of its own (so each change is one atomic round trip that a command already
needed):

==========  =====================================  ===================================
field       meaning                                 written by
==========  =====================================  ===================================
``t``       the publishing process's token          the orchestrator's publication
``p``       claimed, message not yet on the queue   the orchestrator (RabbitMQ only)
``n``       how many times an attempt started       the worker's start
``f``       the holding of the attempt that         the worker's start (a store by any
            started last (the fence)                other attempt is refused)
``w``       the worker (node name and pid) that     the worker's start
            started it last
``r``       the call was cancelled                  the orchestrator's revocation
``h``       taken from a lapsed lease (lease id)    a worker's sweep
==========  =====================================  ===================================

It lives while the call may be published again, queued or held: from its publication
until the result expiry at most, and, once started, the redelivery window past its
last start (a call whose marker and result are both gone is published afresh).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MARKER = "call:"
"""What a marker's key has after toolfleet's key prefix."""


def marker_key(key_prefix: str, task_id: str) -> str:
    """The marker of the call ``task_id``."""
    return f"{key_prefix}{MARKER}{task_id}"


@dataclass(frozen=True, slots=True)
class CallMarker:
    """A call's marker, read."""

    token: str = ""
    """The token of the process that published the call."""
    pending: bool = False
    """Claimed and not yet on the queue (the claimer may have died: see ``abandoned``)."""
    starts: int = 0
    """How many times an attempt started the call."""
    fence: str = ""
    """The holding token of the attempt that started it last."""
    revoked: bool = False
    """The call was cancelled: a worker starting it answers ``cancelled``."""
    handed_on: str = ""
    """The lease the call was taken from when that lease lapsed (its worker was lost)."""
    worker: str = ""
    """The Celery node name of the worker that started the call last."""
    pid: int = 0
    """The process that started it last (a prefork pool process, or the worker)."""

    @classmethod
    def parse(cls, raw: Any) -> CallMarker | None:
        """The marker stored as ``raw`` (``None``: no marker, or not one of toolfleet's)."""
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        return cls(
            token=str(value.get("t") or ""),
            pending=bool(value.get("p")),
            starts=_int(value.get("n")),
            fence=str(value.get("f") or ""),
            revoked=bool(value.get("r")),
            handed_on=str(value.get("h") or ""),
            worker=str(_worker(value)[0]),
            pid=_int(_worker(value)[1]),
        )


def _worker(value: dict[str, Any]) -> tuple[Any, Any]:
    worker = value.get("w")
    if isinstance(worker, list) and len(worker) == 2:
        return worker[0], worker[1]
    return "", 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


LUA_READ = """
local function read_marker(key)
    local raw = redis.call('GET', key)
    if not raw then return nil end
    local ok, value = pcall(cjson.decode, raw)
    if ok and type(value) == 'table' then return value end
    return {}
end
"""
"""Lua: ``read_marker(key)``: the marker as a table; ``nil`` when there is none (a value
that is not a JSON object reads as an empty one). Scripts of both sides start with it."""
