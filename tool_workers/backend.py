"""Celery's Redis result backend, tuned for tool calls.

Two changes to how a state is stored, both in one Lua script (one round trip where
Celery makes two):

* A state never overwrites a stored SUCCESS (Celery checks this with a separate GET;
  here the check and the write are atomic). A call redelivered after its result was
  stored therefore cannot replace that result.
* Besides the task's own channel, the state is published on the *reply channel* of the
  orchestrator that sent the call (the message's ``reply_to``, when it is a toolfleet
  reply channel). An orchestrator subscribes to its reply channel once, instead of to one
  channel per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from tool_workers.protocol import REPLY_CHANNEL_MARK

_bytes_to_str: Callable[[str | bytes], str] = bytes_to_str  # kombu leaves it unannotated


_STORE = """
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
        # transport options (tool_workers.app.celery_config), for TCP connections only.
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
        return [key], [value, int(expires or 0), reply_channel_of(request)]

    def store_in(
        self, pipe: Any, task_id: str, result: Any, state: str, request: Any = None
    ) -> None:
        """Queue the store of a state on ``pipe`` (a pipeline of this backend's client)."""
        keys, args = self.store_args(task_id, result, state, request=request)
        self._script()(keys=keys, args=args, client=pipe)

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
        return self._script()(keys=keys, args=args)
