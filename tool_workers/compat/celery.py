"""Celery's private names, in one place.

* The heartbeat timer's send (``Heart._send``): :class:`Heart` hands it to
  :meth:`Heart.send`, which :mod:`tool_workers.celery_ext.heartbeat` overrides to send
  each heartbeat once.
* The queue table's insertion (``Queues._add``): :class:`Queues` hands it to
  :meth:`Queues.insert`, which :mod:`tool_workers.contract.amqp` overrides to keep each
  queue under its plain name with its broker-side name and arguments.
* The prefork pool: its billiard pool (``TaskPool._pool``), the event loop's time-limit
  timers (``AsynPool._tref_for_id``, keyed by job, the soft limit's one calling
  ``AsynPool._on_soft_timeout``) and the pool's time-limit handlers (attributes
  ``AsynPool`` sets, undocumented), for the watchdog of
  :mod:`tool_workers.celery_ext.event_loop`.
* A task request's "ended by the worker" flags (``Request._already_cancelled`` and
  ``_already_revoked``), for the worker's metrics (:mod:`tool_workers.celery_ext.redaction`).
* The tracer's ``saferepr`` (``celery.app.trace.saferepr``, the module's own name for
  it, looked up at each call): :func:`short_result_repr` puts a shorter repr in front of
  it for one kind of result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.app import amqp as celery_amqp
from celery.app import trace as celery_trace
from celery.concurrency import asynpool, prefork
from celery.worker import heartbeat
from celery.worker import request as celery_request

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "Heart._send": (heartbeat.Heart, "_send", ("self", "event", "retry")),
    "Queues._add": (celery_amqp.Queues, "_add", ("self", "queue")),
    "TaskPool._pool": (prefork.TaskPool, "_pool", ()),
    "AsynPool._tref_for_id": (asynpool.AsynPool, "_tref_for_id", ()),
    "AsynPool._on_soft_timeout": (
        asynpool.AsynPool,
        "_on_soft_timeout",
        ("self", "job", "soft", "hard", "hub"),
    ),
    "AsynPool.on_soft_timeout": (asynpool.AsynPool, "on_soft_timeout", ()),
    "AsynPool.on_hard_timeout": (asynpool.AsynPool, "on_hard_timeout", ()),
    "Request._already_cancelled": (celery_request.Request, "_already_cancelled", ()),
    "Request._already_revoked": (celery_request.Request, "_already_revoked", ()),
    "trace.saferepr": (celery_trace, "saferepr", ("o", "maxlen")),
}
"""Each private name: (owner, attribute, the leading parameters it must take). An
attribute a class sets on its instances (not on the class) is pinned by its owner's
source setting it."""


class Heart(heartbeat.Heart):  # type: ignore[misc]  # celery is unannotated
    """Celery's heartbeat timer whose every event goes out through :meth:`send`."""

    def _send(self, event: str, retry: bool = True) -> Any:
        return self.send(event, retry)

    def send(self, event: str, retry: bool) -> Any:
        """Send heartbeat event ``event`` as Celery does (``retry``: Celery's wish to
        retry a failed send). Override to change how it is sent."""
        return super()._send(event, retry=retry)


class Queues(celery_amqp.Queues):  # type: ignore[misc]
    """Celery's queue table whose every insertion goes through :meth:`insert`."""

    def _add(self, queue: Any) -> Any:
        return self.insert(queue)

    def insert(self, queue: Any) -> Any:
        """Put kombu queue ``queue`` in the table as Celery does (under its name, with
        the default exchange when it has none); what it put. Override to change the entry."""
        return super()._add(queue)


def billiard_pool(task_pool: Any) -> Any:
    """The billiard pool (Celery's ``AsynPool``) of prefork ``TaskPool`` ``task_pool``;
    ``None`` while it is not started. A pool restart replaces it: ask again each time."""
    return task_pool._pool


def take_soft_timer(pool: Any, key: Any) -> bool:
    """Cancel the event loop's pending soft-limit timer of job ``key`` in ``pool`` (an
    ``AsynPool``); whether there was one.

    ``False`` also when the timer fired: the pool then holds the job's hard-limit timer
    in its place, which stays.
    """
    entry = (getattr(pool, "_tref_for_id", None) or {}).get(key)  # none before a loop ran
    if entry is None or entry.canceled:
        return False
    if getattr(entry.fun, "__name__", "") != "_on_soft_timeout":
        return False
    entry.cancel()
    return True


def soft_limit(pool: Any, job: Any) -> None:
    """Run ``pool``'s soft-limit handler (billiard's: it signals the pool process) for
    billiard job record ``job``."""
    pool.on_soft_timeout(job)


def hard_limit(pool: Any, job: Any) -> None:
    """Run ``pool``'s hard-limit handler (billiard's: it stores the timeout result and
    kills the pool process) for billiard job record ``job``."""
    pool.on_hard_timeout(job)


def intercept_hard_limit(pool: Any, hook: Callable[[Any, Callable[[Any], None]], None]) -> None:
    """Route ``pool``'s hard-limit handler through ``hook(job, handler)``, where
    ``handler`` is the one it had: the event loop's timers and :func:`hard_limit` both
    call the hook."""
    handler = pool.on_hard_timeout

    def on_hard_timeout(job: Any) -> None:
        hook(job, handler)

    pool.on_hard_timeout = on_hard_timeout


def ended_by_worker(request: Any) -> bool:
    """Whether Celery task request ``request`` was cancelled or revoked by its worker."""
    return bool(request._already_cancelled or request._already_revoked)


def short_result_repr(kind: type, short: Callable[[Any], str]) -> None:
    """Have Celery's tracer write ``short(result)`` where it writes a task's result repr
    (the pool's "succeeded" line and the ``task-succeeded`` event) for a result of type
    ``kind`` exactly, and its own ``saferepr`` for any other. Celery computes that repr
    for every task that succeeds, walking the whole result; installed once per kind."""
    full = celery_trace.saferepr
    shorts = getattr(full, "shorts", None)
    if shorts is None:
        shorts = {}

        def saferepr(o: Any, maxlen: Any = None, *args: Any, **kwargs: Any) -> str:
            given = shorts.get(type(o))
            if given is not None:
                return str(given(o))
            return str(full(o, maxlen, *args, **kwargs))

        saferepr.shorts = shorts  # type: ignore[attr-defined]
        celery_trace.saferepr = saferepr
    shorts[kind] = short
