"""The fence of a call: which of its attempts may start it, and which may store its result.

A call whose worker lease lapsed (:mod:`tool_workers.celery_ext.lease`) is handed on: its
message goes back to the queue while the first attempt may still be running on a worker that is only
unreachable. Each delivery a worker takes carries its *holding* (the worker's held key
and the delivery tag, in the in-memory header :data:`HOLDING_HEADER`), and:

* a delivery starts only while its holding is still recorded (a worker that comes back
  with a prefetched call that was handed on meanwhile does not start it);
* the attempt that starts writes its holding token to the call's fence key, in the round
  trip that counts the start;
* a state is stored only by the attempt named in the fence (the result store's Lua script,
  :mod:`tool_workers.celery_ext.backend`): the attempt that started last. A worker that comes back
  after the call started elsewhere cannot overwrite that attempt's result; a call that
  finished during a cut stores its result on the heal when no other attempt started it
  meanwhile, and is answered with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HOLDING_HEADER = "toolfleet_holding"
"""Message header the worker sets on each delivery it takes: ``[held key, delivery tag]``.

Set in memory only (never on the queued copy), and overwritten whatever a publisher put
there, so a request cannot name another worker's holding.
"""

HELD = "held:"
"""What a held key has after toolfleet's key prefix (``<prefix>held:<lease id>``)."""


def held_key(key_prefix: str, lease_id: str) -> str:
    """Hash of the calls a lease holds: delivery tag -> ``[task id, message, queues]``."""
    return f"{key_prefix}{HELD}{lease_id}"


def fence_key(key_prefix: str, task_id: str) -> str:
    """The holding token of the attempt that started a call last (the one that may store)."""
    return f"{key_prefix}fence:{task_id}"


def handed_on_key(key_prefix: str, task_id: str) -> str:
    """Set when a call was taken from a lapsed lease: its worker was lost or unreachable."""
    return f"{key_prefix}handed-on:{task_id}"


def fence_of(held: str, task_id: str) -> str:
    """The fence key of ``task_id``, in the key space of the held key ``held``."""
    return fence_key(held.rsplit(HELD, 1)[0], task_id)


def holding_token(held: str, tag: str) -> str:
    """The fence value of the attempt that runs delivery ``tag`` held in ``held``."""
    return f"{held}|{tag}"


def holding_of(request: Any) -> tuple[str, str] | None:
    """The ``(held key, delivery tag)`` the worker noted on a call's delivery, if any."""
    value = getattr(request, HOLDING_HEADER, None) if request is not None else None
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(part, str) and part for part in value)
    ):
        return str(value[0]), str(value[1])
    return None


# KEYS: start counter, revocation record, held hash (or ''), fence (or ''), handed-on
# record. ARGV: lifetime of the records (s), delivery tag, holding token.
# Returns {starts (-1: the holding was taken, not started), revoked, handed-on lease}.
START_SCRIPT = """
if KEYS[3] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[2]) == 0 then
    return {-1, 0, ''}
end
local starts = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
if KEYS[4] ~= '' then
    redis.call('SET', KEYS[4], ARGV[3], 'EX', ARGV[1])
end
local handed = redis.call('GET', KEYS[5]) or ''
return {starts, redis.call('EXISTS', KEYS[2]), handed}
"""


@dataclass(frozen=True)
class Start:
    """What the start round trip of a delivery found."""

    starts: int
    """How many times the call was started, this start included; 0 when not started."""
    revoked: bool
    """The call was cancelled."""
    handed_on: bool
    """The call was taken from a lapsed lease (its worker was lost or unreachable)."""

    @property
    def stale(self) -> bool:
        """The delivery was handed on to another attempt before it started: not started."""
        return self.starts <= 0


def start_args(
    key_prefix: str,
    run_marker: str,
    revoked: str,
    task_id: str,
    expires: int,
    request: Any,
) -> tuple[list[str], list[Any]]:
    """Keys and arguments of :data:`START_SCRIPT` for one delivery."""
    holding = holding_of(request)
    held, fence, tag, token = "", "", "", ""
    if holding is not None:
        held, tag = holding
        fence = fence_of(held, task_id)
        token = holding_token(held, tag)
    keys = [run_marker, revoked, held, fence, handed_on_key(key_prefix, task_id)]
    return keys, [expires, tag, token]


def parse_start(reply: Any) -> Start:
    """The :class:`Start` of a :data:`START_SCRIPT` reply."""
    starts, revoked, handed = reply
    return Start(int(starts), bool(int(revoked)), bool(handed))
