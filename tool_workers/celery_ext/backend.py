"""Celery's Redis result backend, tuned for tool calls.

Two changes to how a state is stored, both in one Lua script (one round trip where
Celery makes two):

* A state never overwrites a stored SUCCESS (Celery checks this with a separate GET;
  here the check and the write are atomic). A call redelivered after its result was
  stored therefore cannot replace that result.
* Fenced: a state stored for a delivery that carries a holding
  (:data:`tool_workers.celery_ext.fence.HOLDING_HEADER`) is written only while that delivery is the
  attempt that started the call last (:func:`tool_workers.celery_ext.fence.fence_key`), or, before
  any attempt started it (a request refused before its start), while the delivery is
  still held. A worker that comes back after its call was handed on cannot overwrite
  the new attempt's state; its refused store is logged.
* Besides the task's own channel, the state is published on the *reply channel* of the
  orchestrator that sent the call (the message's ``reply_to``, when it is a toolfleet
  reply channel). An orchestrator subscribes to its reply channel once, instead of to one
  channel per call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str
from redis.exceptions import NoScriptError

from tool_workers.celery_ext.fence import fence_of, holding_of, holding_token
from tool_workers.contract.names import REPLY_CHANNEL_MARK

log = logging.getLogger("toolfleet.worker")

_bytes_to_str: Callable[[str | bytes], str] = bytes_to_str  # kombu leaves it unannotated


_STORE = """
if ARGV[4] ~= '' then
    local fence = redis.call('GET', KEYS[2])
    -- Not the attempt that started last; or, before any start, a delivery handed on.
    if fence ~= ARGV[4] and (fence or redis.call('HEXISTS', KEYS[3], ARGV[5]) == 0) then
        return -1
    end
end
local current = redis.call('GET', KEYS[1])
if current then
    local ok, meta = pcall(cjson.decode, current)
    if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then
        return 0
    end
end
if tonumber(ARGV[2]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
else
    redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
if ARGV[3] ~= '' then
    redis.call('PUBLISH', ARGV[3], ARGV[1])
end
return 1
"""


_STORES = "_toolfleet_stores"
"""Attribute of a pipeline listing the stores queued on it (position, backend, keys, args)."""


def execute_pipeline(pipe: Any) -> list[Any]:
    """Run a pipeline that may hold stores queued by :meth:`ToolfleetRedisBackend.store_in`.

    Raises:
        redis.RedisError: as ``pipe.execute()`` would (the first command that failed).
    """
    stores = getattr(pipe, _STORES, None)
    if not stores:
        return list(pipe.execute())
    setattr(pipe, _STORES, None)
    results = list(pipe.execute(raise_on_error=False))
    for index, backend, keys, args in stores:
        if isinstance(results[index], NoScriptError):
            results[index] = backend._run_store(keys, args)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def reply_channel_of(request: Any) -> str:
    """The toolfleet reply channel a call's request names, or ``""``."""
    reply_to = getattr(request, "reply_to", None) if request is not None else None
    if isinstance(reply_to, bytes):
        reply_to = reply_to.decode()
    return reply_to if isinstance(reply_to, str) and REPLY_CHANNEL_MARK in reply_to else ""


class ToolfleetRedisBackend(RedisBackend):  # type: ignore[misc]
    """Redis result backend: atomic never-overwrite-success stores, reply-channel publishing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store_script: Any = None
        # Celery has no setting for TCP keepalive options: they come with the backend's
        # transport options (tool_workers.contract.broker.celery_config), for TCP connections only.
        options = (self.app.conf.result_backend_transport_options or {}).get(
            "socket_keepalive_options"
        )
        if options and "path" not in self.connparams:
            self.connparams["socket_keepalive_options"] = options

    def _script(self) -> Any:
        if self._store_script is None:
            self._store_script = self.client.register_script(_STORE)
        return self._store_script

    def store_args(
        self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None
    ) -> tuple[list[str], list[Any]]:
        """Keys and arguments of the store script for one state of one call."""
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = _bytes_to_str(task_id)
        value = self.encode(meta)
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            raise BackendStoreError(
                "value too large for Redis backend", state=state, task_id=task_id
            )
        expires = self.failure_expires if state == states.FAILURE else self.expires
        key = _bytes_to_str(self.get_key_for_task(task_id))
        fence, token, held, tag = "", "", "", ""
        holding = holding_of(request)
        if holding is not None:
            held, tag = holding
            fence = fence_of(held, _bytes_to_str(task_id))
            token = holding_token(held, tag)
        keys = [key, fence, held]
        return keys, [value, int(expires or 0), reply_channel_of(request), token, tag]

    def store_in(
        self, pipe: Any, task_id: str, result: Any, state: str, request: Any = None
    ) -> None:
        """Queue the store of a state on ``pipe`` (a pipeline of this backend's client);
        run the pipeline with :func:`execute_pipeline`.

        The script goes by its digest alone: redis-py would otherwise ask ``SCRIPT
        EXISTS`` in a round trip of its own before every pipeline holding a script. A
        server that does not know the script (restarted, flushed) answers NOSCRIPT for
        this command only, and :func:`execute_pipeline` runs that store again.
        """
        keys, args = self.store_args(task_id, result, state, request=request)
        stores = getattr(pipe, _STORES, None)
        if stores is None:
            stores = []
            setattr(pipe, _STORES, stores)
        stores.append((len(pipe.command_stack), self, keys, args))
        pipe.evalsha(self._script().sha, len(keys), *keys, *args)

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        keys, args = self.store_args(task_id, result, state, traceback, request)
        self.ensure(self._run_store, (keys, args))
        return result

    def _run_store(self, keys: list[str], args: list[Any]) -> Any:
        stored = self._script()(keys=keys, args=args)
        if stored == -1:
            log.warning(
                "did not store a state of call %s: the call was handed on to another "
                "attempt after this worker's lease lapsed",
                keys[1].rsplit(":", 1)[-1],
            )
        return stored
