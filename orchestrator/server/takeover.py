"""Runs of replicas that went away, taken over; runs of this one, handed on.

Every unfinished run is leased to the replica executing it
(:mod:`orchestrator.server.runlease`). :class:`RunTakeover`, the base of
:class:`~orchestrator.server.runner.RunManager`, keeps this replica's leases, stops its
runs whose lease another replica took or that it cannot renew (before it lapses), hands
its runs on when it drains (:class:`Drain`), and goes on with the runs of lapsed leases
it claims: from their thread's checkpoint, as their next attempt, or ends them
``RunLost`` when they cannot go on. A run stopped here for another replica writes
nothing of its end and leaves its tool calls running (:data:`orchestrator.call.HANDED_ON`):
the next attempt attaches to them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.exceptions import RedisError

from orchestrator.backoff import raise_if_cancelled
from orchestrator.call import HANDED_ON
from orchestrator.server.assistant_store import AssistantStore
from orchestrator.server.errors import AtCapacity, NotFound
from orchestrator.server.graphs import GraphSource
from orchestrator.server.records import RunRecord
from orchestrator.server.runlease import LEASE_RENEW
from orchestrator.server.runlookup import RunLookup
from orchestrator.server.schemas import RunCreate
from orchestrator.server.tenancy import TenantQuota

log = logging.getLogger("toolfleet.server")


class Drain:
    """How long a replica told to stop lets its runs go on before handing them on.

    Args:
        seconds: The drain time (``TOOLFLEET_DRAIN_SECONDS``).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.began: float | None = None
        """When the replica was told to stop (``time.monotonic()``), or ``None``."""
        self._when_begun: list[Callable[[], None]] = []

    def when_begun(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` (quick, from a signal handler) when the drain begins: what must
        not wait for its end (the cron beat's lock, which another replica then takes)."""
        self._when_begun.append(stop)

    def begin(self) -> None:
        """The replica is told to stop (SIGTERM): the drain time starts now, once."""
        if self.began is not None:
            return
        self.began = time.monotonic()
        for stop in self._when_begun:
            try:
                stop()
            except Exception:
                log.exception("could not stop %r as the drain began", stop)

    def left(self) -> float:
        """Seconds of the drain time left (all of it before :meth:`begin`)."""
        if self.began is None:
            return self.seconds
        return max(0.0, self.began + self.seconds - time.monotonic())


class RunTakeover(RunLookup):
    """Leases kept, runs handed on and taken over (the base of ``RunManager``)."""

    assistants: AssistantStore
    quota: TenantQuota
    replica_id: str
    max_runs: int
    drain: Drain
    max_attempts: int
    shared_checkpoints: bool
    takeovers: dict[str, int]
    handed_on: int
    _checkpointer: BaseCheckpointSaver[Any]
    _handed: set[str]

    _reserved: int
    # RunManager's own, used here: starting a run's task, and recording a run's end.
    _launch: Callable[[RunRecord, RunCreate, GraphSource, bool], None]
    _finish: Callable[..., Awaitable[None]]

    @property
    def active(self) -> int:
        """Runs this replica is executing or about to."""
        return len(self._tasks) + self._reserved

    async def hand_on(self, run_ids: list[str]) -> None:
        """Stop these runs of this replica without ending them: their leases lapse at
        once, and another replica takes each over at its next look (within
        :data:`~orchestrator.server.runlease.LEASE_RENEW` seconds)."""
        if not run_ids:
            return
        try:
            await self.leases.hand_back(run_ids)
        except (RedisError, OSError) as exc:  # they lapse on their own then
            log.warning("could not hand back %d run lease(s) (%r)", len(run_ids), exc)
        self._stop_here(run_ids, "handed on to another replica")
        tasks = [self._tasks[r] for r in run_ids if r in self._tasks]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_here(self, run_ids: list[str], why: str) -> None:
        """Cancel these runs' tasks as runs another replica goes on with: their tool calls
        are left running and nothing of their end is written."""
        for run_id in run_ids:
            task = self._tasks.get(run_id)
            if task is None:
                continue
            log.warning("run %s stops here: %s", run_id, why)
            self.handed_on += 1
            self._handed.add(run_id)
            HANDED_ON.add(run_id)
            task.cancel()

    async def _keep_leases(self) -> None:
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        self_stop: asyncio.TimerHandle | None = None
        while True:
            await asyncio.sleep(LEASE_RENEW)
            sent = loop.time()
            try:
                renewal = self.leases.renew(list(self._tasks))
                lost = await asyncio.wait_for(renewal, timeout=LEASE_RENEW)
            except (RedisError, OSError, TimeoutError) as exc:
                raise_if_cancelled(exc)
                log.warning("could not renew the run leases (%r)", exc)
                # Before they lapse, this replica's runs stop here: another one takes
                # them over, and two replicas never go on with one run. On a timer, at
                # that instant: the next look may come after they lapsed.
                if self_stop is None:
                    self_stop = loop.call_at(renewed + self.leases.self_stop, self._unrenewed)
                continue
            renewed = sent  # the leases last at least their time from here
            if self_stop is not None:
                self_stop.cancel()
                self_stop = None
            self._stop_here(lost, "its lease lapsed and another replica took it over")
            if self.drain.began is not None:
                continue
            try:
                claimed = await self.leases.claim(self.max_runs - self.active)
            except (RedisError, OSError) as exc:
                raise_if_cancelled(exc)
                log.warning("could not look for lapsed run leases (%r)", exc)
                continue
            for run_id, former in claimed:
                try:
                    await self.take_over(run_id, former)
                except Exception:  # its lease lapses again: a replica tries again then
                    log.exception("could not take over run %s", run_id)

    def _unrenewed(self) -> None:
        self._stop_here(list(self._tasks), "its lease could not be renewed")

    async def take_over(self, run_id: str, former: str) -> None:
        """Go on with a run whose lease this replica just claimed from ``former``: as its
        next attempt, from its thread's checkpoint (tool calls that finished meanwhile
        are reused, those in flight attached to), or end it ``error`` with the reason
        when it cannot go on (no shared checkpoints, attempts used up)."""
        run = await self.store.run(run_id)
        if run is None or run.done or run_id in self._tasks:
            await self.leases.drop(run_id)
            return
        body = RunCreate.model_validate({**run.kwargs, "metadata": {}})
        checkpointed = await self._checkpointed(run)
        why = self._why_not_resumed(run, checkpointed)
        source: GraphSource | None = None
        if why is None:
            try:
                source, _ = await self.assistants.resolve(run.tenant, run.assistant_id)
                self.quota.take(run.tenant)
            except AtCapacity:  # the tenant's share here is full: another replica, later
                await self.leases.hand_back([run_id])
                return
            except NotFound as exc:
                why = str(exc)
        held = await self.store.holder(run.thread_key) == run_id
        held = held and await self.store.renew(run.thread_key, run_id)
        run.attempt += 1
        run.replica = self.replica_id
        await self.store.set_run_attempt(run_id, self.replica_id, run.attempt)
        log.warning(
            "taking over run %s (attempt %d) from replica %s%s",
            run_id,
            run.attempt,
            former or "unknown",
            f": it cannot go on ({why})" if why else "",
        )
        if why is not None or source is None:
            self.takeovers["lost"] += 1
            error = {"error": "RunLost", "message": f"replica {former} went away: {why}"}
            await self._finish(run, body, "error", error, held, run.temporary)
            return
        self.takeovers["resumed"] += 1
        if checkpointed:  # its input is in: it goes on from its thread's checkpoint
            keep = {"input": None, "command": None, "checkpoint": None, "checkpoint_id": None}
            body = body.model_copy(update={**keep, "after_seconds": None})
        if not held:  # in line again to hold its thread
            await self.store.back_in_line(run.thread_key, run_id)
        self._launch(run, body, source, held)

    def _why_not_resumed(self, run: RunRecord, checkpointed: bool) -> str | None:
        if run.attempt >= self.max_attempts:
            return f"its {self.max_attempts} attempts are used up"
        if not checkpointed and not self.shared_checkpoints:
            return (
                "its checkpoints are not in this replica's checkpointer (a SQLite file is "
                "one replica's own: give every replica the same PostgreSQL database)"
            )
        return None

    async def _checkpointed(self, run: RunRecord) -> bool:
        """Whether the thread has a checkpoint the run wrote (its input is in)."""
        config = RunnableConfig(configurable={"thread_id": run.thread_key})
        found = self._checkpointer.alist(config, filter={"run_id": run.run_id}, limit=1)
        async for _ in found:
            return True
        return False
