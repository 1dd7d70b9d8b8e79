"""When crons fire: Celery beat with RedBeat's schedule in Redis, embedded in each replica.

Each replica of ``toolfleet serve`` runs Celery's beat in a thread of its own, with
RedBeat's scheduler: the schedule entries live in Redis (one per cron, written and
deleted as crons are), and beat takes RedBeat's lock there before it ticks, so of any
number of replicas exactly one fires the crons; the others wait for the lock. The lock
lapses ``LOCK_SECONDS`` after its holder last renewed it (every tick, at most
``BEAT_INTERVAL`` apart): a replica that dies hands the crons to another within that,
and a tick it missed fires then (several missed ticks of one cron fire once, as on
LangGraph's server, whose next run is the next tick from now).

The holder turns a tick into a run itself (:meth:`CronBeat.fire`, on the replica's
event loop): no message crosses a broker, and the run executes on that replica like a
run a client started there. Before that it checks the cron: one whose record is gone
(deleted, or expired) has its entry removed; one whose assistant or thread is gone, or
whose schedule ticks more often than ``TOOLFLEET_CRON_MIN_INTERVAL`` allows (stored
before the limit), is stopped: disabled, the reason in its metadata
(``stopped_reason``), its entry removed. Then it claims the tick in Redis (one key per
cron, the time of its last tick that fired, moved forward only), so a second scheduler
that believed it held the lock (one that stalled past the lock's expiry) cannot start
the same tick's run twice. RedBeat records a tick as done before the run is created: a
replica that dies in between loses that one tick.

A tick refused (the cron stopped, the tick claimed by another scheduler, the run refused:
the tenant's quota or share of runs) leaves nothing behind (the run's creation is all
or nothing) and is logged once per cron and reason, on the replica that meets it, until
one of the cron's ticks starts a run again.

The schedules are croniter's (five fields, or six with seconds last, in a timezone),
as LangGraph's server reads them; RedBeat stores them as entries of its own kind here.

Beat stops at the first error of a lost link to Redis; the replica's :class:`BeatThread`
starts it again after the shared backoff's delay, and the new beat waits for the lock as
any other does (its former holder's lapses ``LOCK_SECONDS`` after its last renewal).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis
from celery import Celery
from celery.schedules import BaseSchedule, schedstate
from redbeat import RedBeatScheduler, RedBeatSchedulerEntry
from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator.server.assistant_store import AssistantStore
from orchestrator.server.beatthread import BeatThread
from orchestrator.server.cronstore import (
    CronStore,
    cron_key,
    next_tick,
    run_request,
    shortest_gap,
)
from orchestrator.server.errors import NotFound
from orchestrator.server.guards.account import QuotaExceeded
from orchestrator.server.keys import Keys
from orchestrator.server.store import Store
from orchestrator.server.tenancy import split_thread_key, thread_key
from tool_workers.contract.connections import redis_connection_kwargs
from tool_workers.contract.settings import Settings

log = logging.getLogger("toolfleet.server")

BEAT_INTERVAL = 5.0
"""Longest sleep of beat between two looks at the schedule, in seconds."""

LOCK_SECONDS = 5 * BEAT_INTERVAL
"""How long RedBeat's lock outlives its holder's last renewal."""

FIRE_TIMEOUT = 60.0
"""Longest wait of beat's thread for a tick's run to be created."""

TASK = "toolfleet.cron"
"""The task name of the entries (beat sends no task: the tick is handed to the replica)."""


class CronSchedule(BaseSchedule):  # type: ignore[misc]
    """A cron expression in a timezone, as croniter reads it, ending at ``end_time``."""

    def __init__(
        self,
        expression: str,
        timezone: str | None = None,
        end_time: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.expression = expression
        self.timezone = timezone
        self.end_time = end_time

    def due_tick(self, last_run_at: datetime | None) -> datetime | None:
        """The tick that is due after ``last_run_at``: the first one after it (``None``:
        no tick ever again)."""
        upcoming = next_tick(self.expression, last_run_at or self.now(), self.timezone)
        if upcoming is None:
            return None
        if self.end_time is not None and upcoming > datetime.fromisoformat(self.end_time):
            return None
        return upcoming

    def remaining_estimate(self, last_run_at: datetime) -> timedelta | None:
        upcoming = self.due_tick(last_run_at)
        if upcoming is None:
            return None  # RedBeat then leaves the entry out of every tick
        return upcoming - datetime.now(UTC)

    def is_due(self, last_run_at: datetime) -> schedstate:
        remaining = self.remaining_estimate(last_run_at)
        if remaining is None:
            return schedstate(False, BEAT_INTERVAL)
        if remaining.total_seconds() > 0:
            return schedstate(False, remaining.total_seconds())
        following = next_tick(self.expression, datetime.now(UTC), self.timezone)
        wait = (following - datetime.now(UTC)).total_seconds() if following else BEAT_INTERVAL
        return schedstate(True, max(wait, 0.1))

    def as_json(self) -> dict[str, Any]:
        """What RedBeat stores of it."""
        return {
            "__type__": "toolfleet-cron",
            "expression": self.expression,
            "timezone": self.timezone,
            "end_time": self.end_time,
        }

    def __repr__(self) -> str:
        return f"<CronSchedule {self.expression!r} {self.timezone or 'UTC'}>"


class CronEntry(RedBeatSchedulerEntry):  # type: ignore[misc]
    """A RedBeat entry whose schedule is a :class:`CronSchedule`."""

    @staticmethod
    def decode_definition(definition: Any) -> Any:
        decoded = RedBeatSchedulerEntry.decode_definition(definition)
        raw = decoded.get("schedule")
        if isinstance(raw, dict) and raw.get("__type__") == "toolfleet-cron":
            decoded["schedule"] = CronSchedule(
                raw["expression"], raw.get("timezone"), raw.get("end_time")
            )
        return decoded

    schedule: Any
    _saved_score: float | None = None

    def save(self) -> CronEntry:
        # RedBeat's encoder knows its own schedule kinds: store this one as JSON of its
        # own (a dict is written as it is), then let RedBeat write the entry as ever.
        schedule: Any = self.schedule
        self._saved_score = self.score
        self.schedule = _Stored(schedule.as_json())
        try:
            super().save()
        finally:
            self.schedule = schedule
            self._saved_score = None
        return self

    @property
    def score(self) -> float:
        """When the entry is due, as a UNIX time (RedBeat's order; -1: never again)."""
        if self._saved_score is not None:
            return self._saved_score
        schedule: Any = self.schedule
        remaining = schedule.remaining_estimate(self.last_run_at or datetime.now(UTC))
        if remaining is None:
            return -1.0
        return float((datetime.now(UTC) + remaining).timestamp())


class _Stored(dict[str, Any]):
    """A schedule as the JSON RedBeat's encoder writes (a dict is written as it is)."""


class CronScheduler(RedBeatScheduler):  # type: ignore[misc]
    """RedBeat's scheduler, handing each due tick to ``fire`` instead of sending a task.

    Args:
        fire: Called in beat's thread with the entry's name and the tick's time.
    """

    Entry = CronEntry

    def __init__(self, *args: Any, fire: Callable[[str, datetime], None], **kwargs: Any) -> None:
        self._fire = fire
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        if self.lock_key and self.lock is None:  # beat_init failed to take it: a lost link
            raise RedisConnectionError("beat could not take its lock")
        return super().tick(*args, **kwargs)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> None:
        if not isinstance(entry.schedule, CronSchedule):
            return
        tick = entry.schedule.due_tick(entry.last_run_at)
        entry = self.reserve(entry) if advance else entry
        if tick is not None:
            self._fire(entry.name, tick)


def beat_app(settings: Settings, keys: Keys) -> Celery:
    """A Celery app of the replica's beat: RedBeat in the service's Redis, no broker."""
    app = Celery("toolfleet-crons", set_as_current=False)
    url = settings.own_redis_url
    app.conf.update(
        broker_url="memory://",
        result_expires=None,  # no backend clean-up entry
        timezone="UTC",
        enable_utc=True,
        beat_max_loop_interval=BEAT_INTERVAL,
        beat_enable_remote_control=False,
        redbeat_redis_url=url,
        redbeat_redis_options=redis_connection_kwargs(url, settings),
        redbeat_key_prefix=f"{keys.base}cron-beat:",
        redbeat_lock_timeout=int(LOCK_SECONDS),
    )
    return app


class CronBeat:
    """The replica's beat, and the crons' schedule entries.

    Args:
        settings: Where Redis is.
        keys: Key names of the deployment.
        client: ``redis.asyncio`` client (string responses).
        crons: The crons' records.
        start_run: Starts a run: ``(tenant, thread id or None, request)``.
        assistants: Where a tick looks for its cron's assistant (``None``: it does not).
        threads: Where a tick looks for its cron's thread (``None``: it does not).
    """

    def __init__(
        self,
        settings: Settings,
        keys: Keys,
        client: aioredis.Redis,
        crons: CronStore,
        start_run: Callable[..., Any],
        *,
        assistants: AssistantStore | None = None,
        threads: Store | None = None,
    ) -> None:
        self.app = beat_app(settings, keys)
        self._r: Any = client
        self.crons = crons
        self._start_run = start_run
        self._assistants = assistants
        self._threads = threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._service: BeatThread | None = None
        self._said: dict[str, set[str]] = {}
        """Per cron, the reasons of refused ticks logged since its last run started."""

    # -- schedule entries (blocking Redis calls: run them in a thread) ------------------

    def _entry(self, key: str, doc: dict[str, Any]) -> CronEntry:
        schedule = CronSchedule(doc["schedule"], doc.get("timezone"), doc.get("end_time"))
        return CronEntry(key, TASK, schedule, enabled=bool(doc.get("enabled", True)), app=self.app)

    async def schedule(self, tenant: str, doc: dict[str, Any]) -> None:
        """Write (or rewrite) the cron's entry; its next tick is the first from now. It
        expires with the cron's record (RedBeat drops an entry it cannot load)."""
        name = cron_key(tenant, doc["cron_id"])
        entry = self._entry(name, doc)
        await asyncio.to_thread(entry.save)
        await self._r.expire(entry.key, self.crons.ttl(doc))

    async def unschedule(self, tenant: str, cron_id: str) -> None:
        """Delete the cron's entry."""
        entry = CronEntry(cron_key(tenant, cron_id), TASK, app=self.app)
        await asyncio.to_thread(entry.delete)

    # -- beat ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start beat in its thread (it waits for RedBeat's lock before it ticks)."""
        self._loop = asyncio.get_running_loop()
        scheduler = functools.partial(CronScheduler, fire=self._fire_from_beat)
        self._service = BeatThread(
            self.app, LOCK_SECONDS, scheduler_cls=scheduler, max_interval=BEAT_INTERVAL
        )
        self._service.start()

    def stop_soon(self) -> None:
        """Have beat stop at its next wake (within ``BEAT_INTERVAL``) and release the lock,
        so another replica's beat fires the crons while this replica drains."""
        if self._service is not None:
            self._service.stop()

    async def close(self) -> None:
        """Stop beat (releasing the lock if it holds it).

        A beat that holds the lock is waited for (its current sleep, at most
        ``BEAT_INTERVAL``); one still waiting for the lock is not: its thread stops
        when the process does, and if it takes the lock before that, it releases it at
        once without ticking.
        """
        if self._service is None:
            return
        self._service.stop()
        service = self._service.service  # made by the thread, once it starts
        scheduler = vars(service).get("scheduler") if service is not None else None
        if scheduler is not None and scheduler.lock is not None:
            await asyncio.to_thread(self._service.join, BEAT_INTERVAL + 5)

    def _fire_from_beat(self, name: str, tick: datetime) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self.fire(name, tick), loop)
        future.result(FIRE_TIMEOUT)

    async def fire(self, name: str, tick: datetime) -> str | None:
        """Start the run of the cron ``name``'s tick at ``tick``, unless the cron is
        gone or stopped, or that tick was fired already; returns the run id (``None``:
        nothing started)."""
        tenant, cron_id = split_thread_key(name)
        doc = await self.crons.get(tenant, cron_id)
        if doc is None:
            await self.unschedule(tenant, cron_id)
            await self.crons.delete(tenant, cron_id)  # its count, index entry and claim
            self._once(name, "gone", "cron %s: its record is gone; its schedule dropped", cron_id)
            self._said.pop(name, None)
            return None
        if not doc.get("enabled", True):
            return None
        reason = await self._stop_reason(tenant, doc)
        if reason is not None:
            await self.crons.stop(tenant, doc, reason)
            await self.unschedule(tenant, cron_id)
            log.warning("cron %s: stopped (%s), no more ticks", cron_id, reason)
            self._said.pop(name, None)
            return None
        if not await self.crons.claim(tenant, doc, tick):
            self._once(name, "claimed", "cron %s: tick %s fired already", cron_id, tick.isoformat())
            return None
        try:
            run = await self._start_run(tenant, doc.get("thread_id"), run_request(doc))
        except Exception as exc:
            self._once(
                name,
                type(exc).__name__,
                "cron %s: the run of tick %s was not started: %s (further ticks refused "
                "for this reason are not logged until one starts a run)",
                cron_id,
                tick.isoformat(),
                exc,
                level=logging.WARNING,
            )
            return None
        self._said.pop(name, None)
        try:  # a cron that fires is kept, with its entry
            await self.crons.touch(tenant, doc)
            await self._r.expire(self._entry(name, doc).key, self.crons.ttl(doc))
        except QuotaExceeded:  # its usage record was lost: it is kept as it was
            pass
        log.info("cron %s: tick %s started run %s", cron_id, tick.isoformat(), run.run_id)
        return str(run.run_id)

    async def _stop_reason(self, tenant: str, doc: dict[str, Any]) -> str | None:
        """Why the cron can never tick again as it is (``None``: it can)."""
        if self._assistants is not None:
            try:
                await self._assistants.resolve(tenant, doc["assistant_id"])
            except NotFound:
                return "assistant_not_found"
        thread_id = doc.get("thread_id")
        threads = self._threads
        if thread_id is not None and threads is not None:
            record = await threads.thread(thread_key(tenant, thread_id))
            if record is None:
                return "thread_not_found"
        gap = shortest_gap(doc["schedule"])
        if gap is not None and gap < self.crons.min_interval:
            return "schedule_too_frequent"
        return None

    def _once(
        self, name: str, reason: str, message: str, *args: Any, level: int = logging.INFO
    ) -> None:
        """Log ``message % args`` unless the cron's ticks were refused for ``reason``
        since its last run started."""
        said = self._said.setdefault(name, set())
        if reason not in said:
            said.add(reason)
            log.log(level, message, *args)
