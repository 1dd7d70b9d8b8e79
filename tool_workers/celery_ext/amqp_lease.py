"""Worker leases on RabbitMQ: the calls of a worker host that vanished are running
elsewhere within seconds, as on Redis, not when RabbitMQ's heartbeat gives up.

RabbitMQ keeps an unacknowledged message with the connection it was delivered on, and
gives it back only when that connection closes: at once when the worker's processes die
(the kernel closes the socket), but, when the host vanishes (switched off, its network
gone: no FIN, no RST), only once the AMQP heartbeat notices the silence (two to three
heartbeat intervals). No other client can take the message back from that connection.

So the lease (:mod:`tool_workers.celery_ext.lease`, in the Redis of the results and
markers) decides instead, as on Redis:

* **Held.** The consumer records each delivery it hands to Celery in its lease's held
  hash, with what it takes to publish the message again (body, headers, properties,
  exchange and routing key), under a delivery tag of its own (``amqp:<uuid>``, with
  ``@<copy id>`` when the delivery is a copy); the record goes when the delivery is
  acknowledged or rejected.
* **Handed on as a copy.** A surviving worker's sweep takes the holdings of a lapsed
  lease in one Lua script: for each call that no other attempt started since (its fence
  names the lapsed holding, or nothing), it writes a new *copy id* in the call's marker
  (``c``) and notes the hand-on (``h``), then publishes a copy of the message carrying
  that id (:data:`~tool_workers.celery_ext.fence.COPY_HEADER`). The copy starts as any
  redelivery does: an idempotent call runs again, a non-idempotent one is answered "may
  have partially run".
* **The original is fenced.** Once a marker names a copy, a delivery of the call without
  that copy's id loses its holding when it tries to start
  (:data:`~tool_workers.celery_ext.fence.START_SCRIPT`): not started, acknowledged,
  nothing stored (:func:`dropped_unrun`). That is RabbitMQ's own redelivery of the
  original, once its heartbeat closes the vanished connection, and the vanished worker's
  prefetched calls if it comes back. A vanished worker that comes back while its call
  runs there learns from its next renewal that its lease lapsed and stops the execution
  once the copy started; a result it still stores is refused by the fence (the copy
  started last), as on Redis.

If publishing a copy fails, the copy id is taken back out of the marker: the original,
redelivered by RabbitMQ when its heartbeat fires, then starts as a plain redelivery.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from typing import Any

import redis

from tool_workers.celery_ext.fence import COPY_HEADER, HOLDING_HEADER, held_key, holding_of
from tool_workers.celery_ext.lease import Lease, install, leases_key, start_lease
from tool_workers.contract.connections import redis_client
from tool_workers.contract.marker import LUA_READ
from tool_workers.contract.settings import Settings

log = logging.getLogger("toolfleet.worker")

TAG_PREFIX = "amqp:"
"""What the delivery tag of a holding taken by the RabbitMQ consumer starts with."""

COPY_MARK = "@"
"""Between a holding's tag and the copy id of the delivery (a copy a sweep published)."""

PUBLISH_RETRIES = 3
"""Attempts at publishing one copy (each waits for RabbitMQ's confirm)."""

HANDING_GRACE = 30.0
"""Seconds a sweeper has to publish the copies of a lapsed lease it took: past them (it
died in between) another worker's sweep hands the lease's calls on again, under new copy
ids (only the copy a marker names starts, so a copy published twice runs once)."""

# KEYS: leases zset, handing zset. ARGV: key prefix, lifetime of a marker that is gone (s),
# batch size, a fresh id the copies' ids start with, handing grace (ms).
# Returns {lease id, {task id, copy id, message record}...} for each lease taken.
_SWEEP = (
    LUA_READ
    + """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local batch = tonumber(ARGV[3])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms, 'LIMIT', 0, batch)
-- Leases a sweeper took and did not finish handing on in time (it died meanwhile).
local stuck = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ms, 'LIMIT', 0, batch)
for _, id in ipairs(stuck) do table.insert(lapsed, id) end
local taken = {}
local n = 0
for _, id in ipairs(lapsed) do
    local moved = {id}
    local held = ARGV[1] .. 'held:' .. id
    local entries = redis.call('HGETALL', held)
    for i = 1, #entries, 2 do
        local tag = entries[i]
        local ok, entry = pcall(cjson.decode, entries[i + 1])
        if ok and type(entry) == 'table' and type(entry[1]) == 'string'
                and type(entry[2]) == 'string' then
            local key = ARGV[1] .. 'call:' .. entry[1]
            local marker = read_marker(key) or {}
            local fence = marker['f']
            -- Only a call no other attempt started since this holding took it.
            if type(fence) ~= 'string' or fence == '' or fence == id .. '|' .. tag then
                n = n + 1
                local copy = ARGV[4] .. '.' .. n
                marker['h'] = id
                marker['c'] = copy
                local ttl = redis.call('TTL', key)
                if ttl < 1 then ttl = tonumber(ARGV[2]) end
                redis.call('SET', key, cjson.encode(marker), 'EX', ttl)
                table.insert(moved, {entry[1], copy, entry[2]})
            end
        end
    end
    -- Kept until the copies are out (_DONE); another sweep takes it again after the grace.
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], ms + tonumber(ARGV[5]), id)
    table.insert(taken, moved)
end
return taken
"""
)
"""Takes the holdings of every lapsed lease (and of every lease a sweeper took and did not
finish with) and names, in each call's marker, the copy that alone may start it from now
on."""

# KEYS: handing zset, the lease's held hash. ARGV: lease id. The copies are out.
_DONE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS: the call's marker. ARGV: the copy id. Takes a copy that could not be published
# back out of the marker (only if the marker still names it).
_UNDO = (
    LUA_READ
    + """
local marker = read_marker(KEYS[1])
if not marker or marker['c'] ~= ARGV[1] then
    return 0
end
marker['c'] = nil
local ttl = redis.call('TTL', KEYS[1])
if ttl < 1 then ttl = 60 end
redis.call('SET', KEYS[1], cjson.encode(marker), 'EX', ttl)
return 1
"""
)

PROPERTIES = ("correlation_id", "reply_to", "priority", "delivery_mode")
"""The AMQP properties a copy keeps (Celery's headers carry the rest)."""


def handing_key(key_prefix: str) -> str:
    """Sorted set of the lapsed leases a sweeper took: member the lease id, score the
    deadline (server ms) by which its copies are out."""
    return f"{key_prefix}handing"


def holding_tag(copy: str | None) -> str:
    """A new delivery tag for a holding (``@<copy id>`` at its end for a copy)."""
    tag = f"{TAG_PREFIX}{uuid.uuid4().hex}"
    return f"{tag}{COPY_MARK}{copy}" if copy else tag


def dropped_unrun(request: Any) -> bool:
    """Whether a delivery refused at its start (its holding gone) is dropped without an
    answer: on RabbitMQ its call was handed on as a copy, which answers."""
    holding = holding_of(request)
    return holding is not None and holding[1].startswith(TAG_PREFIX)


def message_record(message: Any, headers: dict[str, Any]) -> str:
    """What it takes to publish ``message`` again, as JSON."""
    body = message.body
    record: dict[str, Any] = {}
    if isinstance(body, bytes):
        try:
            record["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            record["body"] = base64.b64encode(body).decode("ascii")
            record["b64"] = True
    else:
        record["body"] = str(body)
    properties = message.properties if isinstance(message.properties, dict) else {}
    delivery = message.delivery_info if isinstance(message.delivery_info, dict) else {}
    record.update(
        headers={k: v for k, v in headers.items() if k not in (HOLDING_HEADER, COPY_HEADER)},
        properties={k: properties[k] for k in PROPERTIES if properties.get(k) is not None},
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        exchange=delivery.get("exchange") or "",
        routing_key=delivery.get("routing_key") or "",
    )
    return json.dumps(record, separators=(",", ":"), default=str)


class AmqpLease(Lease):
    """A worker's lease on RabbitMQ: deliveries held by the consumer, a lapsed lease's
    calls handed on as copies (see the module)."""

    app: Any = None
    """The worker's Celery app (its broker connection publishes the copies)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connection: Any = None
        self._amqp_sweep = self.client.register_script(_SWEEP)
        self._done = self.client.register_script(_DONE)
        self._undo = self.client.register_script(_UNDO)

    # --- the consumer's side -----------------------------------------------------------
    def hold(self, message: Any) -> None:
        """Record a delivery under this lease and note its holding on its headers (in
        memory). Without Redis the delivery runs unfenced, as it would without a lease."""
        headers = message.headers
        if not isinstance(headers, dict):
            return
        headers.pop(HOLDING_HEADER, None)  # the worker's to set, never a publisher's
        copy = headers.get(COPY_HEADER)
        tag = holding_tag(copy if isinstance(copy, str) and copy else None)
        task_id = str(headers.get("id"))
        entry = json.dumps([task_id, message_record(message, headers)], separators=(",", ":"))
        with self._lock:
            lease_id = self.id
            self._holding[tag] = (lease_id, task_id)
        held = held_key(self.key_prefix, lease_id)
        try:
            self.client.hset(held, tag, entry)
        except redis.RedisError as exc:
            log.warning("could not hold call %s under this worker's lease: %r", task_id, exc)
            with self._lock:
                self._holding.pop(tag, None)
            return
        headers[HOLDING_HEADER] = [held, tag]

    def release(self, holding: Any) -> None:
        """The delivery was acknowledged or rejected: its record goes (at the next
        renewal; a call swept meanwhile finds its stored result)."""
        if holding is None:
            return
        held, tag = holding
        with self._lock:
            self._holding.pop(tag, None)
            self._released.append((held, tag))

    def unacked_keys(self) -> tuple[str, str] | None:
        """None: RabbitMQ keeps the unacknowledged deliveries."""
        return None

    # --- the sweep ---------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Hand on the calls of every lapsed lease as copies; the task ids handed on."""
        handing = handing_key(self.key_prefix)
        taken = self._amqp_sweep(
            keys=[leases_key(self.key_prefix), handing],
            args=[
                self.key_prefix,
                max(1, round(self.retention)),
                20,
                uuid.uuid4().hex,
                round(HANDING_GRACE * 1000),
            ],
        )
        calls = []
        for lease_id, *moved in taken or []:
            for task, copy, record in moved:
                task_id, copy_id = _text(task), _text(copy)
                if self._publish(task_id, copy_id, _text(record)):
                    calls.append(task_id)
            lapsed = _text(lease_id)
            self._done(keys=[handing, held_key(self.key_prefix, lapsed)], args=[lapsed])
        if calls:
            log.warning(
                "handed on %d call(s) of a lost or unreachable worker (copies published): %s",
                len(calls),
                ", ".join(calls),
            )
        return calls

    def _publish(self, task_id: str, copy: str, raw: str) -> bool:
        try:
            record = json.loads(raw)
            body: Any = record["body"]
            if record.get("b64"):
                body = base64.b64decode(body)
            headers = {**record.get("headers", {}), COPY_HEADER: copy}
            connection = self._broker()
            producer = connection.Producer()
            producer.publish(
                body,
                exchange=record.get("exchange", ""),
                routing_key=record.get("routing_key", ""),
                headers=headers,
                content_type=record.get("content_type") or "application/json",
                content_encoding=record.get("content_encoding") or "utf-8",
                retry=True,
                retry_policy={"max_retries": PUBLISH_RETRIES, "interval_start": 0.2},
                **record.get("properties", {}),
            )
            return True
        except Exception as exc:
            self._drop_broker()
            log.error(
                "could not publish the copy of call %s of a lost worker (%r): it runs when "
                "RabbitMQ gives back the original",
                task_id,
                exc,
            )
            try:
                self._undo(keys=[f"{self.key_prefix}call:{task_id}"], args=[copy])
            except redis.RedisError as undo_exc:
                log.error("could not take copy %s of call %s back: %r", copy, task_id, undo_exc)
            return False

    def _broker(self) -> Any:
        if self._connection is None:
            if self.app is None:
                raise RuntimeError("no Celery app to publish with")
            self._connection = self.app.connection_for_write()
        return self._connection

    def _drop_broker(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.release()
            except Exception:  # a dead connection: nothing to close cleanly
                log.debug("closing the copies' broker connection failed", exc_info=True)

    def stop(self) -> None:
        super().stop()
        self._drop_broker()


def start_worker_lease(settings: Settings, retention: float, app: Any) -> Lease | None:
    """Start this worker process's lease, on either broker: on RabbitMQ an
    :class:`AmqpLease` in the Redis of the results and markers, publishing copies with
    ``app``; on Redis :func:`tool_workers.celery_ext.lease.start_lease`'s.

    Args:
        settings: The worker's settings.
        retention: Seconds the holdings record outlives a renewal: the visibility timeout.
        app: The worker's Celery app.
    """
    if not settings.broker_is_amqp:
        return start_lease(settings, retention)
    lease = AmqpLease(
        redis_client(settings.own_redis_url, settings),
        settings.key_prefix,
        "",
        ttl=settings.lease_ttl,
        refresh=settings.lease_refresh,
        retention=retention,
    )
    lease.app = app
    install(lease)
    return lease.start()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
