"""Runs: admitted to their thread, executed as asyncio tasks, cancelled from any replica.

The replica that receives a run executes it: ``graph.astream`` in an asyncio task of its
own (never the request's, so a client that disconnects does not stop it), each stream
part appended to the run's event log. There is no thread per run; a replica executes at
most ``TOOLFLEET_MAX_RUNS`` runs and refuses more with 429, so a load balancer can send
the request to another replica.

Cancelling a run cancels its task: the model call in progress is abandoned, and the
toolfleet middleware revokes the run's in-flight tool tasks as the cancellation reaches
them. A cancel request that arrives at another replica is published on the control
channel; the owner also finds it in the run record when it renews its hold on the thread
(every few seconds), in case the message was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import redis.asyncio as aioredis
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.exceptions import RedisError

from orchestrator.backoff import raise_if_cancelled, retried
from orchestrator.call import HANDED_ON
from orchestrator.server.assistant_store import AssistantStore
from orchestrator.server.control import RENEW_INTERVAL, ReplicaControl
from orchestrator.server.encoding import dumps
from orchestrator.server.errors import AtCapacity, Conflict, NotFound, Unsupported
from orchestrator.server.eventlog import EventLog, EventRelay
from orchestrator.server.graphs import GraphSource
from orchestrator.server.guards.clientview import ClientView
from orchestrator.server.keys import Keys
from orchestrator.server.records import RunRecord, now_iso
from orchestrator.server.rollback import delete_run_checkpoints
from orchestrator.server.runconfig import config_json, run_config, thread_config, with_assistant
from orchestrator.server.runlease import RunLeases
from orchestrator.server.runstream import RunStream
from orchestrator.server.schemas import RunCreate
from orchestrator.server.store import Store
from orchestrator.server.takeover import Drain, RunTakeover
from orchestrator.server.tenancy import TenantQuota
from orchestrator.server.webhooks import WebhookSender, cancelled_error, final_values, payload

T = TypeVar("T")

log = logging.getLogger("toolfleet.server")

ADMIT_POLL = 0.1
"""Seconds between attempts of a queued run to take its thread."""

DISCONNECTED = "client disconnected from the run stream (on_disconnect=cancel)"
"""Why a run whose client left is cancelled (LangGraph's server's words)."""


class RunManager(RunTakeover):
    """Starts, tracks and cancels the runs of this replica.

    Args:
        client: ``redis.asyncio`` client (string responses) for control and liveness.
        keys: Key names of the deployment.
        store: Thread and run records.
        events: The run event log.
        relay: Reads event logs for followers on this replica.
        assistants: The assistants runs name (the server's own and the tenants').
        checkpointer: The LangGraph checkpointer (temporary threads are deleted from it).
        max_runs: Runs this replica executes at once.
        replica_id: This replica's id.
        quota: Each tenant's share of the replica's runs (default: all of them).
        webhooks: Delivers the webhooks of finished runs (``None``: a run naming one is
            refused).
        drain: How long this replica's runs may go on once it is told to stop, before
            they are handed on (default: none; they are handed on at once).
        max_attempts: Attempts of a run at most (the first, then takeovers).
        shared_checkpoints: Whether every replica reads the same checkpoints (PostgreSQL):
            a run taken over before its first checkpoint then starts again from its input.
    """

    def __init__(
        self,
        *,
        client: aioredis.Redis,
        keys: Keys,
        store: Store,
        events: EventLog,
        relay: EventRelay,
        assistants: AssistantStore,
        checkpointer: BaseCheckpointSaver[Any],
        max_runs: int,
        replica_id: str,
        quota: TenantQuota | None = None,
        webhooks: WebhookSender | None = None,
        drain: Drain | None = None,
        max_attempts: int = 3,
        shared_checkpoints: bool = False,
    ) -> None:
        self.store = store
        self.events = events
        self.relay = relay
        self.assistants = assistants
        self.graphs = assistants.graphs
        self._checkpointer = checkpointer
        self.max_runs = max_runs
        self.replica_id = replica_id
        self.quota = quota or TenantQuota(max_runs, 0)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._reserved = 0
        self.control = ReplicaControl(client, keys, replica_id, self._cancel_local)
        self._started: set[str] = set()
        self._running: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.webhooks = webhooks
        self._started_at: dict[str, str] = {}
        self.leases = RunLeases(client, keys, replica_id)
        self.drain = drain or Drain(0.0)
        self.max_attempts = max_attempts
        self.shared_checkpoints = shared_checkpoints
        self._handed: set[str] = set()
        self._lease_loop: asyncio.Task[None] | None = None
        self.takeovers = {"resumed": 0, "lost": 0}
        """Runs of lapsed leases this replica went on with, or ended ``RunLost``."""
        self.handed_on = 0
        """Runs this replica stopped for another to go on with (drain, a lost lease)."""

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Announce the replica, listen for cancel requests, keep its runs' leases and
        take over the runs of replicas that went away."""
        await self.control.start()
        self._lease_loop = asyncio.create_task(self._keep_leases(), name="toolfleet-run-leases")

    async def close(self) -> None:
        """Stop: take no more runs, let this replica's runs go on for what is left of the
        drain time, then hand those still running on to the other replicas (their tool
        calls go on running; another replica takes each run over from its checkpoint)."""
        self.drain.begin()
        left = self.drain.left()
        tasks = list(self._tasks.values())
        if tasks and left > 0:
            log.info("draining: %d run(s) may go on for %.0f s", len(tasks), left)
            await asyncio.wait(tasks, timeout=left)
        await self.hand_on(list(self._tasks))
        if self._lease_loop is not None:
            self._lease_loop.cancel()
            await asyncio.gather(self._lease_loop, return_exceptions=True)
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.control.close()

    @property
    def running(self) -> int:
        """Runs whose graph is executing (the others of :attr:`active` wait to start)."""
        return len(self._running)

    # -- starting runs -------------------------------------------------------------------

    async def start_run(self, tenant: str, thread_id: str | None, body: RunCreate) -> RunRecord:
        """Create a run on the tenant's thread (a new temporary one for ``None``), start it.

        Raises:
            NotFound: unknown assistant, or unknown thread and ``if_not_exists="reject"``.
            Conflict: the thread is busy and the multitask strategy is ``reject``
                (``enqueue``, the default, queues the run; ``interrupt`` and ``rollback``
                cancel the thread's run, ``rollback`` deleting it and its checkpoints).
            Unsupported: both ``input`` and ``command`` given.
            AtCapacity: this replica, or the tenant's share of it, holds its maximum of
                runs.
        """
        # NotFound before anything is recorded.
        source, assistant = await self.assistants.resolve(tenant, body.assistant_id)
        if body.input is not None and body.command is not None:
            raise Unsupported("give either input or command, not both")
        if body.webhook is not None:
            if self.webhooks is None:
                raise Unsupported("webhook: this server sends no webhooks")
            await self.webhooks.check(body.webhook)
        if self.drain.began is not None:
            raise AtCapacity("this replica is shutting down; retry on another")
        if self.active >= self.max_runs:
            raise AtCapacity(f"this replica runs {self.max_runs} runs already; retry later")
        self.quota.take(tenant)
        self._reserved += 1
        created: RunRecord | None = None
        try:
            created = await self._create(tenant, thread_id, body, source, assistant)
            return created
        finally:
            self._reserved -= 1
            if created is None:
                self.quota.give_back(tenant)

    async def _create(
        self,
        tenant: str,
        thread_id: str | None,
        body: RunCreate,
        source: GraphSource,
        assistant: dict[str, Any],
    ) -> RunRecord:
        assistant_id = str(assistant["assistant_id"])
        body = with_assistant(body, assistant)
        temporary = thread_id is None
        thread_id = thread_id or str(uuid.uuid4())
        stamp = now_iso()
        run = RunRecord(
            run_id=str(uuid.uuid4()),
            thread_id=thread_id,
            assistant_id=assistant_id,
            created_at=stamp,
            updated_at=stamp,
            status="pending",
            replica=self.replica_id,
            # As LangGraph's server: a run's metadata names its graph and assistant.
            metadata={**body.metadata, "graph_id": source.graph_id, "assistant_id": assistant_id},
            multitask_strategy=body.multitask_strategy,
            kwargs=body.model_dump(mode="json", exclude_none=True, exclude={"metadata"}),
            tenant=tenant,
            temporary=temporary,
        )
        key = run.thread_key
        thread = await self.store.thread(key)
        made_thread = False
        if thread is None:
            if not temporary and body.if_not_exists != "create":
                raise NotFound(f"thread {thread_id} not found")
            # As LangGraph's server: a thread a run makes starts with the run's metadata.
            thread, made_thread = await self.store.create_thread(tenant, thread_id, body.metadata)
        # All or nothing from here: a request that fails leaves no thread, run or lock.
        admitted = stored = False
        try:
            # As LangGraph's server does: chat UIs list an assistant's threads by these.
            tags = {"graph_id": source.graph_id, "assistant_id": assistant_id}
            await self.store.note_run(thread, tags, config_json(body))
            if body.multitask_strategy == "reject":
                if not await self.store.admit(key, run.run_id):
                    holder = await self.store.holder(key)
                    raise Conflict(
                        f"thread {thread_id} is busy (run {holder or 'queued'}); pass "
                        "multitask_strategy 'enqueue' or 'interrupt' to run after it"
                    )
                admitted = True
                await self.store.put_run(run)
                stored = True
                await self.leases.take(run.run_id)
            else:
                await self.store.put_run(run)
                stored = True
                await self.leases.take(run.run_id)
                first = body.multitask_strategy in ("interrupt", "rollback")
                await self.store.enqueue(key, run.run_id, first=first)
                if first and (holder := await self.store.holder(key)):
                    current = await self.store.run(holder)
                    if current is not None and not current.done:
                        await self.cancel(current, action=body.multitask_strategy)
        except BaseException:
            await asyncio.shield(self._undo(run, made_thread, admitted, stored))
            raise
        self._launch(run, body, source, admitted)
        return run

    def _launch(self, run: RunRecord, body: RunCreate, source: GraphSource, held: bool) -> None:
        """Execute the run in a task of its own (``held``: it holds its thread already)."""
        task = asyncio.create_task(
            self._execute(run, body, source, admitted=held, temporary=run.temporary),
            name=f"toolfleet-run-{run.run_id}",
        )
        self._tasks[run.run_id] = task

        def never_started(done: asyncio.Task[None]) -> None:
            # A task cancelled before its first step never enters _execute's try block.
            if done.cancelled() and run.run_id not in self._started:
                status = "handed" if run.run_id in self._handed else "interrupted"
                self._spawn(self._finish(run, body, status, None, held, run.temporary))

        task.add_done_callback(never_started)

    async def _undo(self, run: RunRecord, made_thread: bool, admitted: bool, stored: bool) -> None:
        """Take back what a failed :meth:`_create` wrote."""
        try:
            if admitted:
                await self.store.release(run.thread_key, run.run_id)
            if stored:
                await self.store.leave_queue(run.thread_key, run.run_id)
                await self.store.delete_run(run)
                await self.leases.drop(run.run_id)
            if made_thread:
                await self.store.delete_thread(run.thread_key)
        except (RedisError, OSError):
            log.exception("could not take back the records of run %s", run.run_id)

    # -- executing runs ------------------------------------------------------------------

    async def _execute(
        self,
        run: RunRecord,
        body: RunCreate,
        source: GraphSource,
        *,
        admitted: bool,
        temporary: bool,
    ) -> None:
        status, error, held = "error", None, admitted
        renewer: asyncio.Task[None] | None = None
        graph: Any = None
        try:
            self._started.add(run.run_id)
            if held:
                renewer = asyncio.create_task(self._renew_hold(run))
            if body.after_seconds:
                await asyncio.sleep(body.after_seconds)
            if not held:
                await self._wait_for_thread(run)
                held = True
                renewer = asyncio.create_task(self._renew_hold(run))
            async with self.quota.slot(run.tenant):  # the tenant's runs wait their turn here
                if await self._steady(run, lambda: self._begin(run)):
                    raise asyncio.CancelledError
                self._running.add(run.run_id)
                config = run_config(run, body, source.graph_id)
                graph = await source.for_run(config)
                view = ClientView(run.thread_key, run.thread_id)
                async for event, chunk in RunStream(body, run.thread_id).events(graph, config):
                    await self.events.append(run.run_id, event, view.encode(chunk))
            status = "success"
        except asyncio.CancelledError:
            status = "handed" if run.run_id in self._handed else "interrupted"
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except Exception as exc:
            log.exception("run %s failed", run.run_id)
            view = ClientView(run.thread_key, run.thread_id)
            error = {"error": type(exc).__name__, "message": view.text(str(exc))}
            if graph is not None:
                await self._keep_readable(graph, run)
        finally:
            if renewer is not None:
                renewer.cancel()
            # Shielded: a second cancellation (shutdown) must not leave the thread held.
            await asyncio.shield(self._finish(run, body, status, error, held, temporary))

    async def _steady(self, run: RunRecord, command: Callable[[], Awaitable[T]]) -> T:
        """A command of the run's own against Redis (one that is safe to send again), through
        a lost link for as long as the run may go on without renewing its lease."""
        within = self.leases.self_stop
        return await retried(lambda _: command(), within=within, what=f"run {run.run_id}")

    async def _begin(self, run: RunRecord) -> bool:
        """Mark the run running and its thread busy, unless a cancel was asked for first
        (``True`` then). Safe to do again."""
        if await self.store.cancel_requested(run.run_id):
            return True
        await self.store.set_run_status(run.run_id, "running")
        self._started_at.setdefault(run.run_id, now_iso())
        await self.store.set_thread_status(run.thread_key, "busy")
        return False

    async def _keep_readable(self, graph: Any, run: RunRecord) -> None:
        """After a failed run: a thread whose latest state no longer reads (the run's input
        was written but cannot be applied, e.g. a message of an unknown role) loses that
        run's checkpoints, so the thread keeps its last good state, as LangGraph's server
        shows it; the error stays on the run. Reading the thread or searching the
        tenant's threads never fails because of one failed run."""
        try:
            await graph.aget_state(thread_config(run.thread_key))
        except Exception as exc:
            log.warning(
                "run %s left thread %s unreadable (%s); its checkpoints are dropped",
                run.run_id,
                run.thread_id,
                type(exc).__name__,
            )
            try:
                await delete_run_checkpoints(self._checkpointer, run.thread_key, run.run_id)
            except Exception:
                log.exception("could not drop the checkpoints of failed run %s", run.run_id)

    async def _finish(
        self,
        run: RunRecord,
        body: RunCreate,
        status: str,
        error: dict[str, Any] | None,
        held: bool,
        temporary: bool,
    ) -> None:
        try:
            if status == "handed":  # another replica goes on with it: nothing ends here
                return
            # Each command to Redis goes again through a lost link (_steady; the log's
            # appends on their own): the end is recorded once the link is back.
            store, key, steady = self.store, run.thread_key, functools.partial(self._steady, run)
            if error is not None:
                await self.events.append(run.run_id, "error", dumps(error))
            action = await steady(lambda: store.cancel_action(run.run_id))
            rolled_back = status == "interrupted" and action == "rollback"
            if rolled_back:  # as if it never ran: its checkpoints and its record go
                await delete_run_checkpoints(self._checkpointer, key, run.run_id)
                await steady(lambda: store.delete_run(run))
            else:
                await steady(lambda: store.set_run_status(run.run_id, status, error))
            if held:
                thread_status = await self._thread_status(run, status)
                await steady(lambda: store.set_thread_status(key, thread_status))
                await steady(lambda: store.release(key, run.run_id))
            else:
                await steady(lambda: store.leave_queue(key, run.run_id))
            if status == "interrupted" and error is None:  # as LangGraph's server says it
                reason = await steady(lambda: store.cancel_reason(run.run_id)) if action else None
                error = cancelled_error(rolled_back, reason)
            hook = await self._webhook(run, body, status, error)  # before a thread goes
            if temporary and body.on_completion != "keep":
                await steady(lambda: store.delete_thread(key, keep_runs=True))
                await self._checkpointer.adelete_thread(key)
            await self.events.end(run.run_id, status)  # last: waiters then see it all done
            await steady(lambda: self.leases.drop(run.run_id))
            if hook is not None and self.webhooks is not None and body.webhook:
                self.webhooks.send(body.webhook, hook, tenant=run.tenant)
        except Exception:
            log.exception("could not record the end of run %s", run.run_id)
        finally:
            if self._tasks.pop(run.run_id, None) is not None:
                self.quota.give_back(run.tenant)
            self._started.discard(run.run_id)
            self._running.discard(run.run_id)
            self._started_at.pop(run.run_id, None)
            self._handed.discard(run.run_id)
            HANDED_ON.discard(run.run_id)
        log.info("run %s on thread %s ended: %s", run.run_id, run.thread_id, status)

    async def _webhook(
        self, run: RunRecord, body: RunCreate, status: str, error: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The webhook payload of a run that names one (its thread's final values read
        while the thread still exists)."""
        if body.webhook is None or self.webhooks is None:
            return None
        values = await final_values(self.graphs, run)
        started = self._started_at.get(run.run_id, run.created_at)
        return payload(run, status, error, started, now_iso(), values)

    async def _thread_status(self, run: RunRecord, status: str) -> str:
        # As LangGraph's server: a run that stopped between steps (cancelled, or waiting
        # on an interrupt) leaves its thread interrupted; a rolled-back one, as it was.
        if status == "error":
            return "error"
        source = self.graphs.find(str(run.metadata.get("graph_id", ""))) or self.graphs.default
        graph = await source.for_thread(run.thread_key)
        snapshot = await graph.aget_state(thread_config(run.thread_key))
        return "interrupted" if snapshot.next else "idle"

    async def _wait_for_thread(self, run: RunRecord) -> None:
        renewed = time.monotonic()
        while not await self._steady(run, lambda: self.store.admit(run.thread_key, run.run_id)):
            if await self._steady(run, lambda: self.store.cancel_requested(run.run_id)):
                raise asyncio.CancelledError
            if time.monotonic() - renewed > RENEW_INTERVAL:
                await self._steady(run, lambda: self.store.still_waiting(run.run_id))
                renewed = time.monotonic()
            await asyncio.sleep(ADMIT_POLL)

    async def _renew_hold(self, run: RunRecord) -> None:
        while True:
            await asyncio.sleep(RENEW_INTERVAL)
            try:
                if not await self.store.renew(run.thread_key, run.run_id):
                    log.warning("run %s lost its hold on thread %s", run.run_id, run.thread_id)
                if await self.store.cancel_requested(run.run_id):
                    self._cancel_local(run.run_id)
            except (RedisError, OSError) as exc:
                raise_if_cancelled(exc)
                log.warning("could not renew run %s (%r)", run.run_id, exc)

    # -- cancelling, joining -------------------------------------------------------------

    async def cancel(
        self, run: RunRecord, action: str = "interrupt", reason: str | None = None
    ) -> None:
        """Cancel the run wherever it executes; with ``action="rollback"`` its record and
        the checkpoints it wrote are deleted once it has stopped. ``reason`` is the
        message of the cancellation its webhook carries.

        Raises:
            Conflict: the run has already finished.
        """
        if run.done:
            raise Conflict(f"run {run.run_id} already finished: {run.status}")
        await self.store.request_cancel(run.run_id, action, reason)
        if not self._cancel_local(run.run_id):
            await self.control.request_cancel(run.run_id)

    def cancel_soon(self, run: RunRecord) -> None:
        """Cancel the run from a task of its own: for a request being torn down (a
        client that disconnected), whose own awaits would be cancelled with it. Not
        while this replica shuts down: the requests it cuts then are not clients that
        left, and they reconnect to another replica."""
        if self.drain.began is None:
            self._spawn(self._cancel_quietly(run))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_quietly(self, run: RunRecord) -> None:
        with contextlib.suppress(Conflict):
            await self.cancel(await self.refresh(run), reason=DISCONNECTED)

    def _cancel_local(self, run_id: str) -> bool:
        task = self._tasks.get(run_id)
        if task is None:
            return False
        task.cancel()
        return True
