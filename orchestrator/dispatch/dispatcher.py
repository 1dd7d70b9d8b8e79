"""The Celery dispatcher: tool calls out as Celery tasks, results back on a reply channel.

A call is published at most once (:mod:`.publish`): its task id is derived from its
identity and its marker guards the send, so a second dispatch of the same call, from
this process or a restarted one, attaches to the first instead of running the tool
again. Its result comes back on this dispatcher's reply channel (:mod:`.listener`).

Watching, waiting, reading a result and cancelling are the shared dispatcher's
(:mod:`.transport`); this module is the transport over Celery, and what only a fleet
needs: the epoch of toolfleet's records in Redis, the calls answered as lost, and the
waiters' checks that someone still owns their call. Its few blocking round trips (the
first registry read, a revocation's broadcast, RabbitMQ's producer) run in the
dispatcher's two I/O threads, never on an event loop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

import redis
from celery import Celery

from orchestrator.call import PreparedCall
from orchestrator.dispatch.base import PlacementTable
from orchestrator.dispatch.late import LostCalls
from orchestrator.dispatch.link import LinkHealth, worst
from orchestrator.dispatch.listener import ResultListener
from orchestrator.dispatch.loop_redis import LoopClients
from orchestrator.dispatch.publish import AmqpBroker, Outcome, Publisher
from orchestrator.dispatch.registry import RegistryView, note_placement
from orchestrator.dispatch.transport import VERDICT, TransportDispatcher
from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import async_redis_client, redis_client
from tool_workers.contract.epoch import (
    EpochWatch,
    note_loss,
    read_epoch,
    records_lost_text,
    renew_epoch,
)
from tool_workers.contract.errors import ConfigError, ToolfleetError
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import queue_key, reply_channel, result_key
from tool_workers.contract.settings import Settings, ToolPolicies

log = logging.getLogger("toolfleet.dispatch")

READY_WAIT = 2.0
"""Seconds the first publication waits for the reply channel's subscription; past that
it publishes anyway (the listener's sweep reads what the channel missed)."""

EPOCH_READ_INTERVAL = 1.0
"""Seconds between the ownership checks' reads of the epoch (one read serves them all)."""


class CeleryDispatcher(TransportDispatcher):
    """Publishes calls as Celery tasks and collects their results.

    Args:
        app: A Celery app of the fleet (built from ``settings`` when ``None``): its
            queue table names RabbitMQ's queues, and its control API revokes calls.
        settings: This process's settings.
        owns_app: Close ``app`` with this dispatcher.
    """

    def __init__(self, app: Celery | None, settings: Settings, *, owns_app: bool = False) -> None:
        channel = reply_channel(settings.key_prefix, uuid.uuid4().hex[:16])
        self.listener = ResultListener(
            lambda: async_redis_client(settings.backend_url, settings),
            functools.partial(result_key, settings.namespace),
            channel,
        )
        super().__init__(settings, _read_policies(settings), self.listener)
        self._app = app
        self._owns_app = owns_app or app is None
        self._app_lock = threading.Lock()
        self._redis = redis_client(settings.backend_url, settings)
        self._loop_clients = LoopClients(lambda: async_redis_client(settings.backend_url, settings))
        self._registry = RegistryView(redis_client(settings.own_redis_url, settings), settings)
        self._publish_link = LinkHealth()
        self._amqp = AmqpBroker(self.app, self._io) if settings.broker_is_amqp else None
        self.lost = LostCalls(
            self._redis,
            settings.key_prefix,
            settings.result_expires,
            self._io,
            settings.signing_key,
        )
        """The calls answered as lost, and the late notices of their results."""
        self.listener.on_late = self.lost.heard
        self._publisher = Publisher(
            settings,
            self._redis,
            self._loop_clients,
            channel,
            functools.partial(result_key, settings.namespace),
            functools.partial(queue_key, settings.namespace),
            self.policies.defaults.queue,
            self._amqp,
            self._published,
            self._publish_link,
        )
        self._checking: set[str] = set()
        """Calls whose ownership check is in progress (one at a time per call)."""
        self._epoch_read_at = float("-inf")
        self.epochs = EpochWatch("orchestrator")
        """The epoch of toolfleet's records this process saw last
        (:mod:`tool_workers.contract.epoch`): its losses are counted there."""

    @property
    def app(self) -> Celery:
        """The fleet's Celery app (made on first use when none was given)."""
        with self._app_lock:
            if self._app is None:
                self._app = create_app(self.settings, self.policies)
            return self._app

    # -- registry -------------------------------------------------------------------------

    def served_tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves now (cached for a second unless ``fresh``)."""
        return self._registry.tools(fresh=fresh)

    async def served_tools_async(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """:meth:`served_tools`; a read that must go to Redis runs off the event loop."""
        if not fresh and self._registry.read_once:
            return self._registry.tools()  # a stale map is refreshed in the background
        return await self._off_loop(functools.partial(self._registry.tools, fresh=fresh))

    def served_versions(self, name: str) -> Mapping[str, ToolSpec]:
        """Every served version of ``name`` in the registry map last read (no I/O)."""
        return self._registry.versions(name)

    def registry(self) -> RegistryView:
        """The registry view this dispatcher routes with."""
        return self._registry

    def note_placement(self, table: PlacementTable) -> None:
        """Publish an agent's tool placement for ``toolfleet status`` (best effort)."""
        note_placement(self._redis, self.settings.key_prefix, table)

    async def note_placement_async(self, table: PlacementTable) -> None:
        """:meth:`note_placement` off the event loop."""
        await self._off_loop(self.note_placement, table)

    # -- the transport --------------------------------------------------------------------

    def _before_send(self, calls: Sequence[PreparedCall]) -> None:
        if not self.epochs.known:
            self._read_epoch()
        self.listener.wait_ready(_bounded(READY_WAIT, calls))

    async def _before_watch_async(self) -> None:
        if not self.listener.started:
            await self._off_loop(self.listener.start)  # waits for the thread: not here

    async def _before_send_async(self, call: PreparedCall) -> None:
        if not self.epochs.known:
            await self._off_loop(self._read_epoch)
        if not self.listener.ready:
            await self._off_loop(self.listener.wait_ready, _bounded(READY_WAIT, [call]))

    def _send(self, calls: Sequence[PreparedCall]) -> Mapping[str, Outcome]:
        return self._publisher.publish(calls)

    async def _send_async(self, call: PreparedCall) -> Outcome:
        return await self._publisher.publish_async(call)

    def _read_now(self, task_ids: Sequence[str]) -> None:
        # Their states are not on this process's reply channel: read their keys.
        self.listener.read_now(task_ids)

    def _publishing(self, task_ids: Sequence[str]) -> set[concurrent.futures.Future[None]]:
        return self._publisher.publishing(task_ids)

    def _epoch(self) -> str:
        return self._publisher.epoch

    def _revoke_sent(self, task_ids: Sequence[str], terminate: bool) -> None:
        ids = list(task_ids)
        # Recorded before the broadcast: a worker that misses the broadcast (down, or
        # started later) reads the record before it starts the call, and does not run it.
        try:
            self._publisher.record_revoked(ids)
        except redis.RedisError as exc:
            log.warning("could not record the revocation of %d call(s): %r", len(ids), exc)
        try:
            self.app.control.revoke(ids, terminate=terminate, signal="SIGTERM")
        except Exception as exc:  # revocation is best effort; the run is ending anyway
            log.warning("could not revoke %d call(s): %r", len(ids), exc)

    def link_trouble(self) -> str | None:
        """How long Redis has been unreachable, and why, if it is now (else ``None``)."""
        return worst(self.listener.link, self._publish_link)

    # -- a fleet's own checks -------------------------------------------------------------

    def _check_soon(self, call: PreparedCall) -> None:
        """Check in the background that someone still owns ``call`` (the waiter never
        waits for the check: during a cut it would take the socket timeouts). Not while
        the reply channel is down: the check cannot reach Redis either."""
        if not self.listener.ready:
            return
        with self._lock:
            if call.task_id in self._checking:
                return
            self._checking.add(call.task_id)
        try:
            self._io.submit(self._still_published, call)
        except RuntimeError:  # closed
            with self._lock:
                self._checking.discard(call.task_id)

    def _read_epoch(self) -> None:
        """Read the epoch (written when missing) for the calls' messages; a change from
        the one seen before is a loss of Redis data (logged, counted, noted)."""
        prefix = self.settings.key_prefix
        self._epoch_read_at = time.monotonic()
        since = self.epochs.generation
        try:
            epoch, missing = read_epoch(self._redis, prefix)
        except redis.RedisError as exc:  # the messages go out without one: run as before
            log.warning("could not read the epoch of toolfleet's records: %r", exc)
            return
        if self.epochs.seen(epoch, missing=missing, since=since):
            note_loss(self._redis, prefix, "orchestrator", _how(missing), epoch)
        self._publisher.epoch = self.epochs.known

    def _records_lost(self, call: PreparedCall, stamped: str) -> None:
        """The marker of ``call``, published here under the epoch ``stamped``, is gone
        with no result stored: Redis lost data. When the epoch does not show it (still
        ``stamped``: a replica promoted while behind), it is replaced, so workers refuse
        the call's copies when its tool is not idempotent. The call is answered "may
        have run" when its tool is not idempotent, and published again otherwise."""
        prefix = self.settings.key_prefix
        if stamped and stamped == self.epochs.known:
            since = self.epochs.generation
            epoch = renew_epoch(self._redis, prefix, stamped)
            if self.epochs.lost_marker(epoch, since=since):
                note_loss(self._redis, prefix, "orchestrator", "a published call's marker", epoch)
            self._publisher.epoch = self.epochs.known
        if call.idempotent(self.policies):
            log.warning("Redis lost call %s to %s; publishing it again", call.task_id, call.tool)
            self._after(self._publisher.publish([call]))
            return
        log.error(
            "Redis lost call %s to non-idempotent tool %s: answered as may have run",
            call.task_id,
            call.tool,
        )
        verdict = ToolResult.error("redelivered", records_lost_text(call.tool))
        with self._lock:
            future = self._futures.get(call.task_id)
        if future is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_result({"status": VERDICT, "task_id": call.task_id, "verdict": verdict})

    def _answered(self, call: PreparedCall, result: ToolResult) -> None:
        self.lost.answered(call, result)

    def _still_published(self, call: PreparedCall) -> None:
        """Publish again a call nobody will: its claimer died before publishing it, or
        Redis lost its marker and its message."""
        try:
            if time.monotonic() - self._epoch_read_at >= EPOCH_READ_INTERVAL:
                self._read_epoch()
            if self._publisher.abandoned(call):
                with self._lock:
                    stamped = self._sent.get(call.task_id)
                if stamped is not None:
                    self._records_lost(call, stamped)
                    return
                log.warning(
                    "call %s has neither a marker nor a result; publishing it", call.task_id
                )
                self._after(self._publisher.publish([call]))
        except (redis.RedisError, ToolfleetError) as exc:  # Redis restarting: check again later
            log.warning("could not check call %s: %r", call.task_id, exc)
        finally:
            with self._lock:
                self._checking.discard(call.task_id)

    def data_losses(self) -> int:
        """Losses of toolfleet's records in Redis this process noticed (its epoch watch)."""
        return self.epochs.losses

    def close(self) -> None:
        """Stop the result listener and drop connections."""
        super().close()
        self._publisher.close()
        self._registry.close()
        self._loop_clients.close()
        self._redis.close()
        if self._amqp is not None:
            self._amqp.close()
        if self._owns_app and self._app is not None:
            self._app.close()


def _how(missing: bool) -> str:
    return "the epoch key was missing" if missing else "the epoch changed"


def _bounded(seconds: float, calls: Sequence[PreparedCall]) -> float:
    """``seconds``, or less: never past the calls' run deadline."""
    left = [c.deadline - time.monotonic() for c in calls if c.deadline is not None]
    return max(min([seconds, *left]), 0.0)


def _read_policies(settings: Settings) -> ToolPolicies:
    try:
        return settings.policies()
    except ConfigError as exc:
        log.warning("tool policy not readable (%s); no tool is placed by it", exc)
        return ToolPolicies()
