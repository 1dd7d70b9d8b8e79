"""Celery's Redis result backend, tuned for tool calls: each state in one round trip.

A state is stored by one Lua script (Celery makes two round trips, a read then a
transaction):

* **Fenced.** A state stored for a delivery that carries a holding
  (:data:`tool_workers.celery_ext.fence.HOLDING_HEADER`) is written only while that
  delivery is the attempt that started the call last (the fence in the call's marker,
  :mod:`tool_workers.contract.marker`), or, before any attempt started it (a request
  refused before its start), while the delivery is still held. A worker that comes back
  after its call was handed on cannot overwrite the new attempt's state; its refused
  store is logged. A refused *result* (the attempt finished after its call was handed on
  and answered, as lost, by another) is kept as the call's late result instead
  (:func:`tool_workers.contract.names.late_key`), published on the reply channel as a
  late notice, logged and counted: whoever owns the call can learn that it did run.
* **First answer wins** where there is no fence (RabbitMQ, or a result backend on
  another Redis than the broker): a state never overwrites a stored answer (a SUCCESS,
  or the FAILURE of a call's error result, :mod:`tool_workers.contract.failed`), checked
  and written atomically. A call redelivered after its result was stored cannot
  replace that result.
* **The acknowledgement with the outcome.** On a Redis broker with a worker lease, the
  script that stores a call's outcome also acknowledges its delivery (fenced as the
  lease's own acknowledgement: only a delivery the worker still holds), and the
  consumer's acknowledgement then makes no round trip of its own
  (:func:`tool_workers.celery_ext.lease.acknowledged_by_store`).
* **Published once**, on the *reply channel* of the orchestrator that sent the call
  (the message's ``reply_to``, when it is a toolfleet reply channel), or else on the
  task's own channel as Celery does. An orchestrator subscribes to its reply channel
  once, instead of to one channel per call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend
from kombu.utils.encoding import bytes_to_str

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.fence import holding_of, holding_token
from tool_workers.contract import failed
from tool_workers.contract.connections import run_script
from tool_workers.contract.marker import LUA_READ, marker_key
from tool_workers.contract.names import LATE_FIELD, REPLY_CHANNEL_MARK, late_key, tool_from_task
from tool_workers.observability.metrics import active as active_metrics

log = logging.getLogger("toolfleet.worker")

_bytes_to_str: Callable[[str | bytes], str] = bytes_to_str  # kombu leaves it unannotated


_STORE = (
    LUA_READ
    + """
-- KEYS: the result key, the call's marker, the held hash (or ''), the late-result key,
-- kombu's unacked hash and index (or '': the delivery is not acknowledged here).
-- ARGV: the state (JSON), its lifetime (s, 0: none), the channel to publish it on,
-- the holding token (or ''), the delivery tag, the module of a call's failure, the
-- opening of a late record ('' for a state that is not the call's outcome).
-- Returns {1 stored, 0 an answer was there (unfenced), -1 not this attempt's to store,
-- -2 a result not this attempt's to store, kept as the call's late result; 1 when the
-- delivery was acknowledged (it was still held: removed from kombu's unacked records)}.
local function store()
    if ARGV[4] ~= '' then
        local marker = read_marker(KEYS[2])
        local fence = marker and marker['f']
        -- Not the attempt that started last; or, before any start, a delivery handed on.
        if fence ~= ARGV[4] and (fence or redis.call('HEXISTS', KEYS[3], ARGV[5]) == 0) then
            if not ARGV[7] or ARGV[7] == '' then
                return -1
            end
            -- The first late result of the call is the one kept.
            local late = ARGV[7] .. ARGV[1] .. '}'
            local kept
            if tonumber(ARGV[2]) > 0 then
                kept = redis.call('SET', KEYS[4], late, 'NX', 'EX', ARGV[2])
            else
                kept = redis.call('SET', KEYS[4], late, 'NX')
            end
            if not kept then
                return -1
            end
            redis.call('PUBLISH', ARGV[3], late)
            return -2
        end
    else
        local current = redis.call('GET', KEYS[1])
        if current then
            local ok, meta = pcall(cjson.decode, current)
            if ok and type(meta) == 'table' and (meta['status'] == 'SUCCESS' or (
                meta['status'] == 'FAILURE' and type(meta['result']) == 'table'
                and meta['result']['exc_module'] == ARGV[6])) then
                return 0
            end
        end
    end
    if tonumber(ARGV[2]) > 0 then
        redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
    else
        redis.call('SET', KEYS[1], ARGV[1])
    end
    redis.call('PUBLISH', ARGV[3], ARGV[1])
    return 1
end
local stored = store()
-- The fenced acknowledgement (tool_workers.celery_ext.lease): only a delivery this
-- worker still holds; its held record stays until the lease's next renewal.
local acked = 0
if (KEYS[5] or '') ~= '' and KEYS[3] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[5]) == 1 then
    redis.call('HDEL', KEYS[5], ARGV[5])
    redis.call('ZREM', KEYS[6], ARGV[5])
    acked = 1
end
return {stored, acked}
"""
)


def reply_channel_of(request: Any) -> str:
    """The toolfleet reply channel a call's request names, or ``""``."""
    reply_to = getattr(request, "reply_to", None) if request is not None else None
    if isinstance(reply_to, bytes):
        reply_to = reply_to.decode()
    return reply_to if isinstance(reply_to, str) and REPLY_CHANNEL_MARK in reply_to else ""


def state_meta(
    task_id: str, result: Any, state: str, traceback: Any = None, done: str | None = None
) -> dict[str, Any]:
    """A state as Celery's Redis backend keeps it, the empty fields left out (Celery's
    readers take each with a default)."""
    meta: dict[str, Any] = {"status": state, "result": result, "task_id": task_id}
    if traceback is not None:
        meta["traceback"] = traceback
    if done is not None:
        meta["date_done"] = done
    return meta


class ToolfleetRedisBackend(RedisBackend):  # type: ignore[misc]
    """Redis result backend: fenced or first-answer-wins stores, published once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store_script: Any = None
        # Celery has no setting for TCP keepalive options: they come with the backend's
        # transport options (tool_workers.contract.broker.celery_config), for TCP
        # connections only.
        options = (self.app.conf.result_backend_transport_options or {}).get(
            "socket_keepalive_options"
        )
        if options and "path" not in self.connparams:
            self.connparams["socket_keepalive_options"] = options
        # Where the calls' markers are (tool_workers.contract.broker.celery_config).
        self._key_prefix = str(self.app.conf.get("toolfleet_key_prefix") or "toolfleet:")

    def _script(self) -> Any:
        if self._store_script is None:
            self._store_script = self.client.register_script(_STORE)
        return self._store_script

    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Store (and publish) one state of a call, in one round trip, retried while the
        link is down (the backend's retry policy)."""
        task_id = _bytes_to_str(task_id)
        encoded = self.encode_result(result, state)
        # Celery's app.now(), without its round of timezone conversions (one per call).
        done = datetime.now(self.app.timezone).isoformat() if state in states.READY_STATES else None
        value = self.encode(state_meta(task_id, encoded, state, traceback, done))
        expires = self.failure_expires if state == states.FAILURE else self.expires
        key = _bytes_to_str(self.get_key_for_task(task_id))
        held, tag, token = "", "", ""
        holding = holding_of(request)
        if holding is not None:
            held, tag = holding
            token = holding_token(held, tag)
        channel = reply_channel_of(request) or key
        late = late_key(self._key_prefix, task_id)
        # A result refused by the fence is kept as the call's late result: the record is
        # this opening, the state, and "}" (put together in the script). A revocation is
        # not one: it is this attempt being stopped, not what the call did.
        outcome = state in (states.SUCCESS, states.FAILURE)
        opening = f'{{"{LATE_FIELD}":{time.time():.3f},"meta":' if outcome else ""
        # The call's outcome acknowledges its delivery in the same round trip (Redis
        # broker, with a lease): the consumer's acknowledgement then has none of its own.
        lease = leases.current() if holding is not None and outcome else None
        unacked = lease.unacked_keys() if lease is not None else None
        keys = [key, marker_key(self._key_prefix, task_id), held, late, *(unacked or ("", ""))]
        args = [value, int(expires or 0), channel, token, tag, failed.__name__, opening]
        self.ensure(self._run_store, (task_id, keys, args, state, request))
        return encoded

    def _run_store(
        self, task_id: str, keys: list[str], args: list[Any], state: str, request: Any
    ) -> Any:
        stored, acked = run_script(self.client, self._script(), keys, args)
        if acked:
            leases.acknowledged_by_store(str(args[4]))
        if stored == -1:
            log.warning(
                "did not store a state of call %s: the call was handed on to another "
                "attempt after this worker's lease lapsed",
                task_id,
            )
        elif stored == -2:
            tool = tool_from_task(str(getattr(request, "task", "") or "")) or "?"
            log.warning(
                "late result of call %s to %s (%s): it finished here after the call was "
                "handed on to another attempt, which answered it; kept under %s, not as "
                "the call's answer",
                task_id,
                tool,
                state,
                keys[3],
            )
            metrics = active_metrics()
            if metrics is not None:
                metrics.late(tool, getattr(request, "hostname", "") or "")
        return stored


class ToolfleetSentinelBackend(ToolfleetRedisBackend, SentinelBackend):  # type: ignore[misc]
    """:class:`ToolfleetRedisBackend` on the primary that Redis Sentinels name
    (``sentinel://`` URLs, ``master_name`` in the backend's transport options)."""
