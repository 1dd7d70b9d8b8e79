"""Scale-down without waiting: on a warm shutdown (SIGTERM, as Kubernetes and Docker
send it), a worker stops taking calls and gives back at once the calls it fetched but
has not started.

Celery's warm shutdown stops consuming and lets running calls finish, but the calls a
worker prefetched (``TOOLFLEET_PREFETCH_MULTIPLIER`` above 1, a retry waiting for its
countdown, a call waiting for a free pool process) stay unacknowledged in its hands
until its running calls are done: up to the longest time limit, while other workers
idle. This consumer step runs when the shutdown begins, before the pool waits: it
cancels the task consumer (no new deliveries), then hands each call that was reserved or
scheduled when the shutdown began (noted from the ``worker_shutting_down`` signal, since
Celery forgets them when its consumer closes) and that no pool process has started back
to the head of its queue.

On the Redis transport each hand-back is one Lua script, atomic with the call's start
(:data:`tool_workers.celery_ext.fence.START_SCRIPT`): it gives the delivery back only
while the call's marker does not name this delivery's holding as the attempt that
started, and removes the holding in the same step, so a pool process that reaches the
call afterwards finds it handed on and does not start it (nor store anything). A call is
thus either finished here or run elsewhere, never both. On RabbitMQ, where no lease or
fence makes a hand-back safe against a pool process that is about to start the call,
nothing is handed back early: RabbitMQ gives the calls back when the worker's connection
closes, at the end of its warm shutdown.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import bootsteps, signals
from celery.worker import state as worker_state

from tool_workers.celery_ext import lease as leases
from tool_workers.celery_ext.fence import holding_token
from tool_workers.contract.marker import LUA_READ, marker_key

log = logging.getLogger("toolfleet.worker")

# KEYS: the held hash, kombu's unacked hash and index, the call's marker, the queue list.
# ARGV: delivery tag, this delivery's holding token, the message to push back.
# Returns 1 when the delivery went back to its queue; 0 when it stays (this delivery
# started the call, or it is no longer held here: acknowledged or handed on already).
_HAND_BACK = (
    LUA_READ
    + """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then
    return 0
end
local marker = read_marker(KEYS[4])
if marker and marker['f'] == ARGV[2] then
    return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('RPUSH', KEYS[5], ARGV[3])
return 1
"""
)


class HandBack(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is unannotated
    """Consumer step: at a warm shutdown, give back the calls fetched and not started."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "toolfleet hand-back"

    def stop(self, c: Any) -> None:
        """The consumer stops (a warm shutdown): before the pool waits for its calls."""
        requests, _noted[:] = list(_noted), []
        try:
            hand_back(c, requests)
        except Exception:  # a failed hand-back leaves the calls to the connection's close
            log.exception("could not hand back the calls this worker fetched")

    def shutdown(self, c: Any) -> None:
        """Nothing more: the consumer's connection closes after this."""


def waiting_requests() -> list[Any]:
    """Calls this worker holds that no pool process has accepted (reserved or waiting
    for their countdown)."""
    held = set(worker_state.reserved_requests) | set(worker_state.scheduled_requests)
    active = set(worker_state.active_requests)
    return [r for r in held if r not in active and not r.time_start and not r.acknowledged]


def hand_back(c: Any, requests: list[Any]) -> int:
    """Stop consuming and hand back each of ``requests`` no pool process started; how
    many went back."""
    consumer = getattr(c, "task_consumer", None)
    if consumer is not None:
        try:
            consumer.cancel()
        except Exception as exc:  # the connection is gone: nothing more arrives anyway
            log.debug("cancelling the task consumer failed: %r", exc)
    requests = [r for r in requests if not r.time_start]
    if not requests:
        return 0
    lease = leases.current()
    unacked = lease.unacked_keys() if lease is not None else None
    if lease is None or unacked is None:  # RabbitMQ (or no lease): back when it closes
        return 0
    moved = []
    for request in requests:
        if _hand_back_held(lease, unacked, request.message, str(request.id)):
            request.acknowledged = True  # not Celery's to acknowledge or restore now
            moved.append(str(request.id))
    if moved:
        log.warning(
            "shutting down: handed back %d call(s) not started here to their queues: %s",
            len(moved),
            ", ".join(sorted(moved)),
        )
    return len(moved)


def _hand_back_held(
    lease: leases.Lease, unacked: tuple[str, str], message: Any, task_id: str
) -> bool:
    """One delivery back to its queue, atomically with the call's start (see module);
    ``unacked``: kombu's unacked hash and index."""
    tag = str(message.delivery_tag)
    held = lease.held_key_of(tag)
    if held is None:
        return False
    client = lease.client
    entry, raw = client.hget(held, tag), client.hget(unacked[0], tag)
    if entry is None or raw is None:
        return False
    queue_key = json.loads(entry)[1]
    payload = json.loads(raw)[0]
    script = client.register_script(_HAND_BACK)
    moved = script(
        keys=[
            held,
            *unacked,
            marker_key(lease.key_prefix, task_id),
            queue_key,
        ],
        args=[tag, holding_token(held, tag), json.dumps(payload, separators=(",", ":"))],
    )
    if moved:
        lease.forget(tag)
    return bool(moved)


_noted: list[Any] = []
"""The calls waiting here when the warm shutdown began (Celery forgets its reserved
requests when the consumer closes, before the consumer's steps stop)."""


def _shutting_down(how: str = "", **_: Any) -> None:
    # In the signal handler: only note the requests (no I/O here; the step does it).
    if how == "Warm":
        _noted[:] = waiting_requests()


def install(app: Any) -> None:
    """Add the hand-back step to ``app``'s worker consumer."""
    app.steps["consumer"].add(HandBack)
    signals.worker_shutting_down.connect(_shutting_down, weak=False)
