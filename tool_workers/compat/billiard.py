"""billiard's private names, in one place.

The worker's time-limit watchdog (:mod:`tool_workers.celery_ext.event_loop`) reads the
prefork pool's job bookkeeping, which billiard keeps private: the table of running jobs
(``Pool._cache``) and, per job, when a pool process accepted it, its time limits and
the number it is keyed by. :func:`running_jobs` hands them out as a :class:`JobView`.

A pool process's soft time limit is billiard's ``SIGUSR1`` handler, a module function
billiard does not document; :func:`is_soft_limit_handler` recognises it, so that
:mod:`tool_workers.celery_ext.soft_limit` takes it over only in a pool process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from billiard import pool as billiard_pool

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "Pool._cache": (billiard_pool.Pool, "_cache", ()),
    "ApplyResult._job": (billiard_pool.ApplyResult, "_job", ()),
    "ApplyResult._time_accepted": (billiard_pool.ApplyResult, "_time_accepted", ()),
    "ApplyResult._soft_timeout": (billiard_pool.ApplyResult, "_soft_timeout", ()),
    "ApplyResult._timeout": (billiard_pool.ApplyResult, "_timeout", ()),
    "ApplyResult.worker_pids": (billiard_pool.ApplyResult, "worker_pids", ("self",)),
    "ApplyResult.ready": (billiard_pool.ApplyResult, "ready", ("self",)),
    "TimeoutHandler.on_soft_timeout": (
        billiard_pool.TimeoutHandler,
        "on_soft_timeout",
        ("self", "job"),
    ),
    "TimeoutHandler.on_hard_timeout": (
        billiard_pool.TimeoutHandler,
        "on_hard_timeout",
        ("self", "job"),
    ),
    "soft_timeout_sighandler": (billiard_pool, "soft_timeout_sighandler", ("signum", "frame")),
}
"""Each private name: (owner, attribute, the leading parameters it must take). An
attribute a class sets on its instances (not on the class) is pinned by its owner's
source setting it."""


@dataclass(frozen=True)
class JobView:
    """What the pool records of one job (a task call handed to a pool process)."""

    key: Any
    """The number the pool keys the job by (its event-loop timers use it too)."""
    accepted: float | None
    """``time.monotonic()`` when a pool process accepted the job (``None``: not yet)."""
    pid: int | None
    """The pool process running the job (``None``: not accepted yet)."""
    soft: float | None
    """The job's soft time limit in seconds (``None`` or 0: none)."""
    hard: float | None
    """The job's hard time limit in seconds (``None`` or 0: none)."""
    ready: bool
    """Whether the job has its result."""
    job: Any
    """billiard's own record of the job, to hand back to the pool's time-limit handlers."""


def job_view(job: Any, key: Any = None) -> JobView:
    """The :class:`JobView` of billiard's job record ``job`` (``key``: its table key,
    when read from the table; else the number the job keeps)."""
    pids = job.worker_pids()
    return JobView(
        key=job._job if key is None else key,
        accepted=job._time_accepted,
        pid=pids[0] if pids else None,
        soft=job._soft_timeout,
        hard=job._timeout,
        ready=bool(job.ready()),
        job=job,
    )


def running_jobs(pool: Any) -> list[JobView]:
    """The jobs in billiard pool ``pool``'s table (handed out, not yet finished).

    Safe from another thread than the one driving the pool: the table is copied in one
    step (the pool's thread keeps changing it).
    """
    return [job_view(job, key) for key, job in dict(pool._cache).items()]


def is_soft_limit_handler(handler: Any) -> bool:
    """Whether signal handler ``handler`` is billiard's soft-limit handler (the one it
    installs in each pool process)."""
    return handler is billiard_pool.soft_timeout_sighandler
