"""Finding a run and waiting for it to end, on any replica (the base of
:class:`~orchestrator.server.runner.RunManager`).

An unfinished run has a lease (:mod:`orchestrator.server.runlease`): when its replica
goes away, another replica takes it over within the lease, whether anyone reads it or
not. Only a run without one (its lease lost with Redis's data) whose replica stopped
renewing its liveness is marked failed when it is looked up: nobody else will end it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.server.control import ReplicaControl
from orchestrator.server.errors import NotFound
from orchestrator.server.eventlog import END, EventLog, EventRelay, FollowerDropped
from orchestrator.server.records import RunRecord
from orchestrator.server.runlease import RunLeases
from orchestrator.server.store import Store


class RunLookup:
    """Reads runs through the store, their events through the relay."""

    store: Store
    events: EventLog
    relay: EventRelay
    control: ReplicaControl
    leases: RunLeases
    _tasks: dict[str, asyncio.Task[Any]]

    async def get_run(self, tenant: str, thread_id: str, run_id: str) -> RunRecord:
        """The run of the tenant's thread; one without a lease whose replica died is
        marked failed here.

        Raises:
            NotFound: no such run on the thread (or it is another tenant's).
        """
        run = await self.store.run(run_id)
        if run is None or run.thread_id != thread_id or run.tenant != tenant:
            raise NotFound(f"run {run_id} not found on thread {thread_id}")
        if run.done or run.run_id in self._tasks:
            return run
        if await self.leases.leased(run.run_id) or await self.control.alive(run.replica):
            return run
        run.error = {
            "error": "ReplicaLost",
            "message": f"orchestrator replica {run.replica} stopped while it ran this run",
        }
        run.status = "error"
        await self.store.set_run_status(run.run_id, "error", run.error)
        await self.store.release(run.thread_key, run.run_id)
        await self.events.end(run.run_id, "error")
        return run

    async def refresh(self, run: RunRecord) -> RunRecord:
        """The run's record as it is now (see :meth:`get_run`)."""
        return await self.get_run(run.tenant, run.thread_id, run.run_id)

    async def wait_done(self, run: RunRecord, poll: float = 5.0) -> RunRecord:
        """Wait until the run has finished; returns its final record."""
        if run.done:
            return run
        last = await self.events.last(run.run_id)
        if last is not None and last.event == END:
            return await self.refresh(run)
        async with self.relay.follow(run.run_id, last.id if last else "0-0") as follower:
            while True:
                try:
                    entry = await follower.next(timeout=poll)
                except FollowerDropped:  # no more entries come: watch the record instead
                    await asyncio.sleep(poll)
                    entry = None
                if entry is not None and entry.event == END:
                    break
                if entry is None and (await self.refresh(run)).done:
                    break
        return await self.refresh(run)
