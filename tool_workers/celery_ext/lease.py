"""Worker leases: the calls of a worker that died or became unreachable go back to the
queue within seconds, whatever their time limits.

kombu's Redis transport gives a dead worker's unacknowledged calls back only after the
visibility timeout, which must outlast the longest time limit (330 s with the default
policy). Instead, each worker process holds a *lease* in Redis, renewed every
``TOOLFLEET_LEASE_REFRESH`` seconds from a thread of its own (a busy or stalled consumer
loop does not make a live worker look dead) and lapsing ``TOOLFLEET_LEASE_TTL`` seconds
after the last renewal. Next to it, the worker records every call it holds (reserved or
running: one entry per delivery tag, its task id and queue, written in the round trip
where kombu records the delivery as unacknowledged; the message itself is kombu's copy).

Every worker also sweeps: in one Lua script (atomic, so two sweepers never move one call
twice, and kombu's own restore never also restores it) it takes the holdings of every
lease that lapsed, moves each message still unacknowledged back to its queue, and records
in the call's marker that it was handed on (:mod:`tool_workers.contract.marker`). The
visibility timeout stays as the last resort, for calls whose holdings record was lost.

Which attempt of a handed-on call may start it and store its result is the fence's
(:mod:`tool_workers.celery_ext.fence`). A worker that comes back after its lease lapsed
learns it from its next renewal: it stops its executions that another attempt has since started,
takes a new lease, and never acknowledges a delivery it no longer holds (the message,
under the same tag, now belongs to another worker).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from celery.worker import state as worker_state

from tool_workers.celery_ext.fence import HOLDING_HEADER, held_key, holding_in, holding_token
from tool_workers.contract.connections import redis_client
from tool_workers.contract.marker import LUA_READ, CallMarker, marker_key
from tool_workers.contract.settings import Settings

log = logging.getLogger("toolfleet.worker")

SWEEP_BATCH = 20
"""Lapsed leases one sweep takes at most (the next sweep, a refresh later, takes more)."""


def leases_key(key_prefix: str) -> str:
    """Sorted set of live leases: member the lease id, score its deadline (server ms)."""
    return f"{key_prefix}leases"


# KEYS: leases zset, own held hash. ARGV: lease id, ttl ms, first renewal (1/0),
# retention ms of the records, then the delivery tags settled since the last renewal
# (their held records go). Returns 1, or 0 when the lease was swept: its holdings were
# handed on.
_RENEW = """
for i = 5, #ARGV, 1000 do
    redis.call('HDEL', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if ARGV[3] ~= '1' and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    return 0
end
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""

_SWEEP = (
    LUA_READ
    + """
-- KEYS: leases zset, kombu's unacked hash, kombu's unacked index.
-- ARGV: key prefix, lifetime of a marker that is gone (s), batch size.
-- Returns the task ids moved back to their queues.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms, 'LIMIT', 0, tonumber(ARGV[3]))
local moved = {}
for _, id in ipairs(lapsed) do
    local held = ARGV[1] .. 'held:' .. id
    local entries = redis.call('HGETALL', held)
    for i = 1, #entries, 2 do
        local tag = entries[i]
        local ok, entry = pcall(cjson.decode, entries[i + 1])
        -- Only a delivery still unacknowledged: an acked one is done, and one kombu
        -- restored already is on its queue.
        local raw = redis.call('HGET', KEYS[2], tag)
        if ok and type(entry) == 'table' and raw then
            redis.call('HDEL', KEYS[2], tag)
            redis.call('ZREM', KEYS[3], tag)
            local decoded, unacked = pcall(cjson.decode, raw)
            local payload = decoded and type(unacked) == 'table' and unacked[1]
            if type(payload) == 'table' then
                -- Marked redelivered, as kombu marks a message it restores.
                if type(payload['headers']) == 'table' then
                    payload['headers']['redelivered'] = true
                end
                local props = payload['properties']
                if type(props) == 'table' and type(props['delivery_info']) == 'table' then
                    props['delivery_info']['redelivered'] = true
                end
                redis.call('RPUSH', entry[2], cjson.encode(payload))
                local key = ARGV[1] .. 'call:' .. entry[1]
                local marker = read_marker(key) or {}
                marker['h'] = id
                local ttl = redis.call('TTL', key)
                if ttl < 1 then ttl = tonumber(ARGV[2]) end
                redis.call('SET', key, cjson.encode(marker), 'EX', ttl)
                table.insert(moved, entry[1])
            end
        end
    end
    redis.call('DEL', held)
    redis.call('ZREM', KEYS[1], id)
end
return moved
"""
)
"""Hands on the calls of every lapsed lease, atomically: each delivery still
unacknowledged goes back to its queue (the message from kombu's ``unacked`` hash), and
its marker records which lease it was taken from."""


# KEYS: the held hash the delivery was recorded in, kombu's unacked hash and index.
# ARGV: delivery tag. Returns 1 when removed, 0 when the delivery had been handed on.
_ACK = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    return 1
end
return 0
"""


class Lease:
    """The lease of one worker process and the calls it holds.

    Args:
        client: A Redis client of the broker (its own connections: the lease thread
            must not wait on the consumer's).
        key_prefix: toolfleet's key prefix (``settings.key_prefix``).
        broker_prefix: The broker's global key prefix (``"<namespace>:"`` or ``""``),
            in front of kombu's ``unacked`` keys.
        ttl: Seconds a lease lives after its last renewal.
        refresh: Seconds between renewals (and sweeps).
        retention: Seconds the holdings record outlives a renewal (at least the longest
            a call may be held: a record that expired falls back to the visibility
            timeout).
        clock: This process's monotonic clock, for the waits it keeps itself (a sweep
            held back, the watch after a lapse); the lease's own deadline is Redis's
            time. Tests pass one they advance.
    """

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str,
        broker_prefix: str,
        ttl: float,
        refresh: float,
        retention: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self._clock = clock
        self.key_prefix = key_prefix
        self.broker_prefix = broker_prefix
        self.ttl = ttl
        self.refresh = refresh
        self.retention = max(retention, ttl * 3)
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._first = True
        self._sweeps_from = 0.0
        # delivery tag -> (lease id it was taken under, task id)
        self._holding: dict[str, tuple[str, str]] = {}
        self._to_stop: list[str] = []
        # (held key, delivery tag) released without a round trip: removed at the next tick
        self._released: list[tuple[str, str]] = []
        # Until then (monotonic), the executions here are checked against their calls'
        # markers each tick: set when a lapse is seen, for the visibility timeout, so a
        # rerun that starts after the heal still stops the stale execution here.
        self._watch_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew = client.register_script(_RENEW)
        self._sweep = client.register_script(_SWEEP)
        self._ack = client.register_script(_ACK)

    @property
    def held(self) -> str:
        """The Redis key of the holdings of the current lease."""
        return held_key(self.key_prefix, self.id)

    # --- the consumer's side (RabbitMQ: :mod:`tool_workers.celery_ext.amqp_lease`) ---
    def hold(self, message: Any) -> None:
        """Hold a delivery the consumer is about to hand to Celery (on Redis the
        transport's QoS does it, in the round trip kombu records the delivery in)."""

    def release(self, holding: Any) -> None:
        """The delivery of ``holding`` was acknowledged or rejected (on Redis the QoS's
        fenced acknowledgement removed its records, or its result's store did:
        :meth:`settle`)."""

    def settle(self, tag: str) -> None:
        """Delivery ``tag`` was acknowledged by the store of its result: its record goes
        now in this process, and its held entry from Redis with the next renewal, in the
        same round trip. (No later delivery can take the tag meanwhile: the message is no
        longer unacknowledged, so nothing gives it back to a queue.)"""
        held = self.held_key_of(tag)
        with self._lock:
            self._holding.pop(tag, None)
            if held is not None:
                self._released.append((held, tag))

    def _renew_releasing(self, lease_id: str, first: bool) -> bool:
        """Renew lease ``lease_id`` and remove, in the same script, the held records of
        the deliveries released since the last renewal. Those of an earlier lease of this
        worker (released after a lapse) go in a pipeline of their own."""
        held = held_key(self.key_prefix, lease_id)
        with self._lock:
            done, self._released = self._released, []
        try:
            earlier = [(key, tag) for key, tag in done if key != held]
            if earlier:
                with self.client.pipeline(transaction=False) as pipe:
                    for key, tag in earlier:
                        pipe.hdel(key, tag)
                    pipe.execute()
            tags = [tag for key, tag in done if key == held]
            ttl_ms = max(1, round(self.ttl * 1000))
            retention_ms = max(1, round(self.retention * 1000))
            return bool(
                self._renew(
                    keys=[leases_key(self.key_prefix), held],
                    args=[lease_id, ttl_ms, "1" if first else "0", retention_ms, *tags],
                )
            )
        except redis.RedisError:
            with self._lock:
                self._released[:0] = done
            raise

    def unacked_keys(self) -> tuple[str, str] | None:
        """The full keys of kombu's ``unacked`` hash and ``unacked_index`` sorted set,
        where this worker's deliveries are recorded (None on RabbitMQ)."""
        return f"{self.broker_prefix}unacked", f"{self.broker_prefix}unacked_index"

    # --- the transport's side (kombu's QoS, in the consumer loop) ------------------
    def take(self, tag: str, task_id: str) -> str:
        """Note that delivery ``tag`` of ``task_id`` is held; the held key it goes in."""
        with self._lock:
            self._holding[tag] = (self.id, task_id)
            return self.held

    def held_key_of(self, tag: str) -> str | None:
        """The held key delivery ``tag`` was recorded in (None if it was not)."""
        with self._lock:
            taken = self._holding.get(tag)
        return held_key(self.key_prefix, taken[0]) if taken is not None else None

    def still_holds(self, tag: str) -> bool:
        """Whether delivery ``tag`` is still this worker's (not handed on); True for a
        delivery the lease never recorded."""
        held = self.held_key_of(tag)
        return held is None or bool(self.client.hexists(held, tag))

    def acknowledge(self, tag: str, unacked: str, unacked_index: str) -> bool:
        """Remove delivery ``tag`` from kombu's unacked records, only if this worker still
        holds it (one that was handed on, under the same tag, is now another worker's).

        Args:
            tag: The delivery tag.
            unacked: The full key of kombu's ``unacked`` hash.
            unacked_index: The full key of kombu's ``unacked_index`` sorted set.

        Returns:
            False when the delivery had been handed on (nothing was removed).
        """
        held = self.held_key_of(tag)
        with self._lock:
            self._holding.pop(tag, None)
        if held is None:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hdel(unacked, tag)
                pipe.zrem(unacked_index, tag)
                pipe.execute()
            return True
        return bool(self._ack(keys=[held, unacked, unacked_index], args=[tag]))

    def forget(self, tag: str) -> None:
        """Drop delivery ``tag`` from the local record (restored to its queue)."""
        with self._lock:
            self._holding.pop(tag, None)

    def stale_calls(self) -> list[str]:
        """Holding tokens (:func:`~tool_workers.celery_ext.fence.holding_token`) of the
        executions here that must stop: another attempt started their calls."""
        with self._lock:
            calls, self._to_stop = self._to_stop, []
            return calls

    # --- the lease thread ------------------------------------------------------------
    def start(self) -> Lease:
        """Renew (and sweep) every ``refresh`` seconds from a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="toolfleet-lease", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (the lease lapses; a worker shutting down acked or restored its
        calls already)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh + 10)

    def expire(self) -> None:
        """Stop renewing and lapse now: the next sweep of any worker hands on every call
        this worker holds (its consumer is gone, so it would never run or ack them)."""
        self._stop.set()
        if self._thread is not None:  # a renewal in flight would undo the lapse
            self._thread.join(timeout=self.refresh + 10)
        try:
            self.client.zadd(leases_key(self.key_prefix), {self.id: 0})
        except redis.RedisError as exc:
            log.warning("could not lapse this worker's lease now (%r): it lapses in %g s",
                        exc, self.ttl)  # fmt: skip

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except redis.RedisError as exc:
                # A cut link: the lease lapses unless the link is back in time.
                log.debug("lease renewal failed: %r", exc)
                self.hold_sweeps()
            except Exception:  # never let the thread die: a dead one looks like a lost worker
                log.exception("lease renewal failed")
            self._stop.wait(self.refresh)

    def tick(self) -> list[str]:
        """Renew once, then sweep once; the task ids this sweep moved back to queues."""
        lease_id = self.id
        renewed = self._renew_releasing(lease_id, self._first)
        self._first = False
        if not renewed:
            self._lapsed(lease_id)
            self.hold_sweeps()
        if self._clock() < self._sweeps_from:
            return []
        return self.sweep()

    def sweep(self) -> list[str]:
        """Hand on the calls of every lapsed lease (one batch); the task ids handed on."""
        moved = self._sweep(
            keys=[leases_key(self.key_prefix), *(self.unacked_keys() or ())],
            args=[self.key_prefix, max(1, round(self.retention)), SWEEP_BATCH],
        )
        calls = [m.decode() if isinstance(m, bytes) else str(m) for m in moved or []]
        if calls:
            log.warning(
                "requeued %d call(s) of a lost or unreachable worker: %s",
                len(calls),
                ", ".join(calls),
            )
        return calls

    def hold_sweeps(self) -> None:
        """Sweep no lease for one TTL from now: called when this worker could not renew.

        After an outage of Redis itself (or of this worker's link) every lease looks
        lapsed; the other workers renew theirs within a refresh of the link coming back,
        so sweeping only a TTL later hands on the calls of workers still silent then,
        not those of every worker that was cut off together with this one.
        """
        self._sweeps_from = self._clock() + self.ttl

    def watching(self) -> bool:
        """Whether a lapse was seen lately (the running calls may have reruns elsewhere)."""
        return self._clock() < self._watch_until

    def taken_over(self, running: dict[str, str]) -> list[str]:
        """Of the executions running here (holding token -> task id), those whose call
        another attempt has started since (its marker names another holding): their
        tokens. Two executions of one call (its copy, published again after Redis lost
        its records, beside the original) are told apart by their holdings."""
        if not running:
            return []
        markers = self.client.mget([marker_key(self.key_prefix, t) for t in running.values()])
        taken = []
        for token, raw in zip(running, markers, strict=True):
            marker = CallMarker.parse(raw)
            if marker is not None and marker.fence and marker.fence != token:
                taken.append(token)
        return taken

    def _lapsed(self, lease_id: str) -> None:
        """Our lease was swept: every delivery held under it now belongs to the queue."""
        self._watch_until = self._clock() + self.retention
        with self._lock:
            lost = {tag: task for tag, (lid, task) in self._holding.items() if lid == lease_id}
            self.id = uuid.uuid4().hex
            new_id = self.id
        # Deliveries from now on are held under the new lease: register it at once.
        self._renew_releasing(new_id, first=True)
        if not lost:
            log.warning("this worker's lease lapsed while it was unreachable; renewed")
            return
        tokens = {
            holding_token(held_key(self.key_prefix, lease_id), tag): task
            for tag, task in lost.items()
        }
        # A call no other attempt started yet may still store its result here.
        stale = self.taken_over(tokens)
        log.warning(
            "this worker's lease lapsed while it was unreachable: its %d call(s) were "
            "requeued (%s); stopping the %d another attempt has started",
            len(lost),
            ", ".join(sorted(tokens.values())),
            len(stale),
        )
        with self._lock:
            self._to_stop.extend(stale)


def held_entry(task_id: str, queue_key: str) -> str:
    """The holdings entry of one delivery: ``[task id, its queue's list key]``."""
    return json.dumps([task_id, queue_key])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def start_lease(settings: Settings, retention: float) -> Lease | None:
    """Start this worker process's lease and make the transport hold deliveries under it.

    None (no lease: a lost worker's calls come back after the visibility timeout) when
    the result backend is another Redis than the broker: the fence of a call is checked
    against its holding in one script, so both must live in one server. On RabbitMQ the
    lease is :func:`tool_workers.celery_ext.amqp_lease.start_worker_lease`'s.

    Args:
        settings: The worker's settings (``lease_ttl``, ``lease_refresh``, the broker).
        retention: Seconds the holdings record outlives a renewal: the visibility timeout.
    """
    if settings.broker_is_amqp:
        return None  # tool_workers.celery_ext.amqp_lease
    if settings.backend_url != settings.broker_url:
        log.warning(
            "the result backend is another Redis than the broker: no worker lease, a lost "
            "worker's calls come back after the visibility timeout"
        )
        return None
    lease = Lease(
        redis_client(settings.broker_url, settings),
        settings.key_prefix,
        f"{settings.namespace}:" if settings.namespace else "",
        ttl=settings.lease_ttl,
        refresh=settings.lease_refresh,
        retention=retention,
    )
    install(lease)
    return lease.start()


def stop_stale_calls(lease: Lease, pool: Any) -> None:
    """Stop the executions here of calls another attempt started (consumer loop timer).

    Each execution is known by the holding it started under, not by its task id: a copy
    of a call (published again after Redis lost its records) may run here beside the
    original, and only the one the call's marker no longer names stops.
    """
    stale = set(lease.stale_calls())
    running = {}
    for request in list(worker_state.active_requests):
        # The consumer's request of the delivery (its headers: Request.request_dict).
        holding = holding_in(request.request_dict.get(HOLDING_HEADER))
        if holding is not None:
            running[holding_token(*holding)] = request
    if lease.watching():
        # After a lapse, what runs here may have been handed on before or after the heal
        # (and kombu may have dropped its local record in the reconnect): each execution
        # is checked by the holding it started under.
        try:
            stale.update(lease.taken_over({t: r.id for t, r in running.items()}))
        except redis.RedisError as exc:
            log.debug("could not check the running calls' markers: %r", exc)
    for token, request in running.items():
        if token in stale:
            log.warning("stopping call %s: another attempt of it runs now", request.id)
            request.terminate(pool, signal="SIGKILL")


_STORED_ACK_SLOTS = 4096
_stored_acks: Any = None
"""Digests of the deliveries whose result's store acknowledged them
(:mod:`tool_workers.celery_ext.backend`), one slot per digest: shared memory, so the
consumer in the main process sees what a pool process's store did."""


def share_acknowledgements() -> None:
    """Create the table of deliveries acknowledged by their result's store, in the
    worker's main process before the pool forks (its processes inherit it)."""
    global _stored_acks
    if _stored_acks is None:
        _stored_acks = multiprocessing.RawArray("q", _STORED_ACK_SLOTS)


def _digest(tag: str) -> int:
    # The hash seed is inherited across fork: one digest in every process of a worker.
    return (hash(tag) & 0x7FFF_FFFF_FFFF_FFFF) or 1


def acknowledged_by_store(tag: str) -> None:
    """Note that the script that stored a call's outcome acknowledged delivery ``tag``."""
    share_acknowledgements()  # a worker without a pool, or a test: this process's own
    digest = _digest(tag)
    _stored_acks[digest % _STORED_ACK_SLOTS] = digest


def taken_by_store(tag: str) -> bool:
    """Whether delivery ``tag`` was acknowledged by its result's store (the note is
    taken). False when the note was overwritten by another delivery's in its slot: the
    consumer's own fenced acknowledgement then runs, and finds the delivery done."""
    if _stored_acks is None:
        return False
    digest = _digest(tag)
    slot = digest % _STORED_ACK_SLOTS
    if _stored_acks[slot] != digest:
        return False
    _stored_acks[slot] = 0
    return True


_current: Lease | None = None


def install(lease: Lease | None) -> None:
    """Make ``lease`` the one this process's transport records deliveries under."""
    global _current
    _current = lease


def current() -> Lease | None:
    """The lease of this worker process (None outside a worker, e.g. an orchestrator)."""
    return _current
