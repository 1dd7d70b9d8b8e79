"""The fence of a call: which of its attempts may start it, and which may store its result.

A call whose worker lease lapsed (:mod:`tool_workers.celery_ext.lease`) is handed on: its
message goes back to the queue while the first attempt may still be running on a worker
that is only unreachable. Each delivery a worker takes carries its *holding* (the worker's held key
and the delivery tag, in the in-memory header :data:`HOLDING_HEADER`), and:

* a delivery starts only while its holding is still recorded (a worker that comes back
  with a prefetched call that was handed on meanwhile does not start it);
* the attempt that starts writes its holding token to the call's marker (its fence,
  :mod:`tool_workers.contract.marker`), in the round trip that counts the start;
* on RabbitMQ, a call handed on as a copy starts only from that copy (its marker names
  the copy, :data:`COPY_HEADER`): the original, when RabbitMQ gives it back, is dropped;
* a state is stored only by the attempt named in the fence (the result store's Lua script,
  :mod:`tool_workers.celery_ext.backend`): the attempt that started last. A worker that
  comes back after the call started elsewhere cannot overwrite that attempt's result; a
  call that finished during a cut stores its result on the heal when no other attempt
  started it meanwhile, and is answered with it.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any

from tool_workers.contract.epoch import LUA_EPOCH, epoch_key, epoch_of, new_epoch
from tool_workers.contract.marker import LUA_READ, marker_key

HOLDING_HEADER = "toolfleet_holding"
"""Message header the worker sets on each delivery it takes: ``[held key, delivery tag]``.

Set in memory only (never on the queued copy), and overwritten whatever a publisher put
there, so a request cannot name another worker's holding.
"""

COPY_HEADER = "toolfleet_copy"
"""Message header of a copy a sweep published on RabbitMQ
(:mod:`tool_workers.celery_ext.amqp_lease`): the copy's id, which the sweep also wrote in
the call's marker. From then on only a delivery of that copy starts the call."""

HELD = "held:"
"""What a held key has after toolfleet's key prefix (``<prefix>held:<lease id>``)."""


def held_key(key_prefix: str, lease_id: str) -> str:
    """Hash of the calls a lease holds: delivery tag -> ``[task id, queue list key]`` (the
    message itself is in kombu's ``unacked`` hash)."""
    return f"{key_prefix}{HELD}{lease_id}"


def holding_token(held: str, tag: str) -> str:
    """The fence value of the attempt that runs delivery ``tag`` held in ``held``: the
    lease's id and the tag (each names one holding: lease ids are random)."""
    return f"{held.rsplit(HELD, 1)[-1]}|{tag}"


def holding_of(request: Any) -> tuple[str, str] | None:
    """The ``(held key, delivery tag)`` the worker noted on a call's delivery, if any."""
    return holding_in(getattr(request, HOLDING_HEADER, None) if request is not None else None)


def holding_in(value: Any) -> tuple[str, str] | None:
    """The ``(held key, delivery tag)`` of a :data:`HOLDING_HEADER` value, if it is one."""
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(part, str) and part for part in value)
    ):
        return str(value[0]), str(value[1])
    return None


START_SCRIPT = (
    LUA_READ
    + LUA_EPOCH
    + """
-- KEYS: the call's marker, the held hash (or ''), the epoch key.
-- ARGV: the marker's lifetime (s), delivery tag, holding token (or ''), the channel to
-- announce the start on (or ''), the STARTED state to announce, worker name, pid, the
-- epoch the call was published under (or ''), a fresh epoch (for a missing key), '1' to
-- read the epoch even when the call has a marker (or '').
-- Returns {starts (-1: the holding was handed on, not started), revoked, handed-on lease,
-- retries a worker scheduled, the epoch ('' when not read), 1 when the epoch key was
-- missing, 1 when the call's records were lost after its publication (its fate is
-- unknown), 1 when the call had no marker}.
local found = read_marker(KEYS[1])
-- The epoch decides only for a call without a marker; otherwise it is read when asked
-- (each process's periodic look, not a command per call).
local epoch, missing = '', 0
if (not found) or ARGV[10] == '1' then
    epoch, missing = current_epoch(KEYS[3], ARGV[9])
end
-- A call a sweep handed on as a copy (RabbitMQ: tool_workers.celery_ext.amqp_lease)
-- starts only from that copy: its marker names the copy, whose delivery tag ends with
-- '@' and the copy's id. Any other delivery of it (the original, which RabbitMQ gives
-- back when its heartbeat closes the lost worker's connection) loses its holding here.
if KEYS[2] ~= '' then
    local copy = found and found['c']
    if type(copy) == 'string' and copy ~= ''
            and copy ~= (string.match(ARGV[2], '@([^@]+)$') or '') then
        redis.call('HDEL', KEYS[2], ARGV[2])
    end
end
if KEYS[2] ~= '' and redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then
    return {-1, 0, '', 0, epoch, missing, 0, 0}
end
local unknown = 0
if (not found) and ARGV[8] ~= '' and ARGV[8] ~= epoch then
    unknown = 1
end
local marker = found or {}
local starts = (tonumber(marker['n']) or 0) + 1
marker['n'] = starts
if ARGV[3] ~= '' then
    marker['f'] = ARGV[3]
end
marker['w'] = {ARGV[6], tonumber(ARGV[7])}
redis.call('SET', KEYS[1], cjson.encode(marker), 'EX', ARGV[1])
local revoked = marker['r'] and 1 or 0
if revoked == 0 and ARGV[4] ~= '' then
    redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return {
    starts, revoked, marker['h'] or '', tonumber(marker['y']) or 0, epoch, missing, unknown,
    found and 0 or 1
}
"""
)
"""One delivery's start, in one round trip: refused when its holding was handed on (the
worker was cut off and its lease lapsed); otherwise counted in the call's marker, which
names this attempt as the one that may store (the fence), read for a cancellation and
a hand-on, and announced on the caller's reply channel. The marker also names the worker
and process that started it (the worker's main process when it started the call as it
took it: :class:`EarlyStart`)."""


START_SHA = hashlib.sha1(START_SCRIPT.encode()).hexdigest()
"""The start script's digest (its ``EVALSHA`` name)."""


@dataclass(frozen=True)
class Start:
    """What the start round trip of a delivery found."""

    starts: int
    """How many times the call was started, this start included; 0 when not started."""
    revoked: bool
    """The call was cancelled."""
    handed_on: bool
    """The call was taken from a lapsed lease (its worker was lost or unreachable)."""
    scheduled: int = 0
    """Retries a worker scheduled for the call (:data:`RETRY_SCRIPT`): a delivery's
    ``retries`` header counts only up to this; a higher one was written by someone else."""
    epoch: str = ""
    """The epoch of toolfleet's records (:mod:`tool_workers.contract.epoch`); ``""`` when
    the start did not read it (the call had a marker and no read was asked)."""
    epoch_missing: bool = False
    """The epoch key was gone (this start wrote a new one)."""
    unknown: bool = False
    """The call's marker was lost after its publication (published under an earlier
    epoch): whether an earlier attempt started it is unknown."""
    unmarked: bool = False
    """The call had no marker (this start wrote the first)."""

    @property
    def stale(self) -> bool:
        """The delivery was handed on to another attempt before it started: not started."""
        return self.starts <= 0


def start_args(
    key_prefix: str,
    task_id: str,
    lifetime: int,
    request: Any,
    announce: str,
    started: str,
    worker: str = "",
    pid: int = 0,
    check_epoch: bool = True,
) -> tuple[list[str], list[Any]]:
    """Keys and arguments of :data:`START_SCRIPT` for one delivery.

    Args:
        key_prefix: toolfleet's key prefix.
        task_id: The call.
        lifetime: Seconds the marker lives past this start (the redelivery window).
        request: Celery's request of the delivery (its holding, if the worker has a lease).
        announce: The channel the start is announced on (``""``: not announced).
        started: The STARTED state to announce (JSON).
        worker: The worker's node name.
        pid: The process that runs the call.
        check_epoch: Read the epoch even when the call has a marker (a call without one
            always reads it: the epoch decides its fate).
    """
    holding = holding_of(request)
    held, tag, token = "", "", ""
    if holding is not None:
        held, tag = holding
        token = holding_token(held, tag)
    keys = [marker_key(key_prefix, task_id), held, epoch_key(key_prefix)]
    args = [lifetime, tag, token, announce, started if announce else "", worker, pid]
    return keys, [*args, epoch_of(request), new_epoch(), "1" if check_epoch else ""]


def parse_start(reply: Any) -> Start:
    """The :class:`Start` of a :data:`START_SCRIPT` reply."""
    starts, revoked, handed, scheduled, epoch, missing, unknown, unmarked = reply
    if isinstance(epoch, bytes):
        epoch = epoch.decode()
    return Start(
        int(starts),
        bool(int(revoked)),
        bool(handed),
        int(scheduled),
        str(epoch),
        bool(int(missing)),
        bool(int(unknown)),
        bool(int(unmarked)),
    )


EARLY_HEADER = "toolfleet_early"
"""Header the consumer gives a delivery it started early: its :class:`EarlyStart`.

Set in memory only, on the delivery's headers before Celery makes its request of them:
the task body reads it from its request (a prefork pool process gets it with the
request). A publisher cannot forge one: a header off the wire is JSON, never an
:class:`EarlyStart` (:func:`take_early`)."""


@dataclass(frozen=True)
class EarlyStart:
    """A delivery the consumer admitted, and started in the round trip that records it
    as held.

    Only a call that runs at once (a slot free), so that no started call waits. The start
    names the consumer's process, the worker's main process (in a prefork pool, not the
    pool process that runs the call: the result names that one). The request is
    admitted first (signature, tool, age): a refused one is recorded with no start, and
    carries its answer. The task body takes it off its request (:func:`take_early`), and
    neither checks the request again nor runs a start of its own."""

    task_id: str
    request: Any = None
    """The admitted request (:class:`~tool_workers.contract.models.ToolRequest`)."""
    answer: dict[str, Any] | None = None
    """The answer to a request that must not run (then there is no start)."""
    keys: tuple[str, ...] = ()
    """:data:`START_SCRIPT`'s keys, full (the caller strips what its client prefixes)."""
    args: tuple[Any, ...] = ()
    since: int = 0
    """The epoch watch's generation before the start (the task body's loss check)."""
    pid: int = 0
    """The process that ran the start (:attr:`since` is of its watch)."""
    start: Start | None = None
    """What the start found, once it ran."""


def take_early(request: Any) -> EarlyStart | None:
    """The early start the consumer gave the delivery of ``request``, if any, taken off
    the request (a retry publishes the request's other headers on: this one is not JSON)."""
    if request is None:
        return None
    early = getattr(request, EARLY_HEADER, None)
    if early is not None:
        with contextlib.suppress(AttributeError):
            delattr(request, EARLY_HEADER)
    headers = getattr(request, "headers", None)
    if isinstance(headers, dict):
        headers.pop(EARLY_HEADER, None)
    if isinstance(early, EarlyStart) and early.task_id == getattr(request, "id", None):
        return early
    return None


RETRY_SCRIPT = (
    LUA_READ
    + """
-- KEYS: the call's marker. ARGV: the retry's number, the marker's lifetime (s).
local marker = read_marker(KEYS[1]) or {}
if (tonumber(marker['y']) or 0) < tonumber(ARGV[1]) then
    marker['y'] = tonumber(ARGV[1])
end
local ttl = redis.call('TTL', KEYS[1])
if ttl < 1 then ttl = tonumber(ARGV[2]) end
redis.call('SET', KEYS[1], cjson.encode(marker), 'EX', ttl)
return 1
"""
)
"""Note in the call's marker that a worker scheduled retry number ``n`` (Celery's retry
republishes the message with ``retries`` raised by one, a header no signature covers)."""
