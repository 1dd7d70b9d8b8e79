"""The thread lock and the line of runs waiting for a thread, in Redis.

One run at a time holds a thread: ``thread-lock:<id>`` names it, with a TTL its owner
renews, so a replica that dies frees its threads. Runs that may wait for the thread
(multitask strategy ``enqueue``, the default, ``interrupt`` or ``rollback``) line up in
``thread-queue:<id>``; the admission script lets the first in line in, skipping those
whose replica is gone. Every method takes the thread key.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from orchestrator.server.keys import Keys

LOCK_TTL_MS = 30_000
"""How long a thread stays held by a run whose replica stopped renewing it."""

_ADMIT = """
-- KEYS: lock, queue. ARGV: run id, ttl ms, alive-key prefix.
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end  -- again, after a lost answer
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if (not head) or head == ARGV[1] then break end
  if redis.call('EXISTS', ARGV[3] .. head) == 1 then return 0 end
  redis.call('LPOP', KEYS[2])  -- its replica stopped waiting: skip it
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if redis.call('LINDEX', KEYS[2], 0) == ARGV[1] then redis.call('LPOP', KEYS[2]) end
return 1
"""

_IF_HOLDER = """
-- KEYS: lock. ARGV: run id, 'release' | ttl ms.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == 'release' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

_BACK_IN_LINE = """
-- KEYS: queue, the run's alive key. ARGV: run id, ttl ms, queue ttl s.
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('LPUSH', KEYS[1], ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return 1
"""


class ThreadLine:
    """The thread lock and queue, a part of :class:`~orchestrator.server.store.Store`."""

    _r: Any
    _keys: Keys
    _thread_ttl: int

    def _register_line_scripts(self, client: aioredis.Redis) -> None:
        self._admit = client.register_script(_ADMIT)
        self._if_holder = client.register_script(_IF_HOLDER)
        self._back_in_line = client.register_script(_BACK_IN_LINE)

    async def admit(self, thread_id: str, run_id: str) -> bool:
        """Let the run hold the thread if it is free and the run is first in line (a run
        that holds it already is let in again: safe to ask again after a lost answer)."""
        keys = self._keys
        return bool(
            await self._admit(
                keys=[keys.thread_lock(thread_id), keys.thread_queue(thread_id)],
                args=[run_id, LOCK_TTL_MS, keys.run_alive_prefix],
            )
        )

    async def enqueue(self, thread_id: str, run_id: str, *, first: bool = False) -> None:
        """Put the run in the thread's line (at its head for ``first``)."""
        keys = self._keys
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.set(keys.run_alive(run_id), "1", px=LOCK_TTL_MS)
            if first:
                pipe.lpush(keys.thread_queue(thread_id), run_id)
            else:
                pipe.rpush(keys.thread_queue(thread_id), run_id)
            pipe.expire(keys.thread_queue(thread_id), self._thread_ttl)
            await pipe.execute()

    async def back_in_line(self, thread_id: str, run_id: str) -> None:
        """Keep a run taken over from another replica in the thread's line: where it
        waits, if it still does; at the head, if it had the thread (or was dropped)."""
        keys = self._keys
        await self._back_in_line(
            keys=[keys.thread_queue(thread_id), keys.run_alive(run_id)],
            args=[run_id, LOCK_TTL_MS, self._thread_ttl],
        )

    async def still_waiting(self, run_id: str) -> None:
        """Renew the mark that the run's replica still waits to start it."""
        await self._r.set(self._keys.run_alive(run_id), "1", px=LOCK_TTL_MS)

    async def leave_queue(self, thread_id: str, run_id: str) -> None:
        """Take the run out of the thread's line."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.lrem(self._keys.thread_queue(thread_id), 0, run_id)
            pipe.delete(self._keys.run_alive(run_id))
            await pipe.execute()

    async def holder(self, thread_id: str) -> str | None:
        """Id of the run holding the thread."""
        result: str | None = await self._r.get(self._keys.thread_lock(thread_id))
        return result

    async def renew(self, thread_id: str, run_id: str) -> bool:
        """Extend the run's hold on the thread; ``False`` if it lost it."""
        lock = self._keys.thread_lock(thread_id)
        return bool(await self._if_holder(keys=[lock], args=[run_id, LOCK_TTL_MS]))

    async def release(self, thread_id: str, run_id: str) -> None:
        """Free the thread if the run holds it."""
        await self._if_holder(keys=[self._keys.thread_lock(thread_id)], args=[run_id, "release"])
