"""Publish tool calls onto the broker, each at most once: one path, sync and async.

A call is published under its marker (:mod:`tool_workers.contract.marker`). Whoever
finds the marker set attaches to the call instead of publishing it again: another
process, or this one resuming after a crash. A call whose result is already stored is
not published either.

**Batches.** Calls that arrive together go out together: a sync caller that finds no
publication in progress publishes everything waiting, its own calls and those that
arrive while it publishes (the others wait for theirs); async calls join their loop's
batch, published one loop turn later, so the Send tasks of one superstep share it.

**Redis broker** (markers on the broker's own server): one script per batch sets each
call's marker (``SET NX``), checks that no result is stored, and pushes its message
onto the queue's list: a call is marked exactly when its message is queued, so no
half-published state exists. Retried while Redis does not answer, until the run's
deadline (without one, for :data:`RETRY_SECONDS`): a call the lost attempt published
carries this publisher's token and counts as published. A caller never waits past its
run's deadline: a sync caller's batch is published by the publisher's own thread, and an
async caller stops waiting for its batch then; a message that goes out later expires at
that deadline, so no worker runs it.

**RabbitMQ** (markers in Redis, messages elsewhere): the calls are claimed (marker
``pending``), published through a kombu producer with publisher confirms, then marked
published. A publisher that dies in between leaves a ``pending`` marker that expires
after :data:`PENDING_MARKER_TTL`; a waiter then claims and publishes the call itself.

Sync callers' I/O runs in the publisher's thread; async callers' on their event loop,
through that loop's own ``redis.asyncio`` client, except for RabbitMQ's producer, which
blocks and runs in the dispatcher's I/O threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from orchestrator.backoff import Backoff
from orchestrator.call import PreparedCall
from orchestrator.dispatch.envelope import (
    TaskMessage,
    after_publish,
    before_publish,
    redis_envelope,
    task_message,
)
from orchestrator.dispatch.link import LinkHealth
from orchestrator.dispatch.loop_redis import LoopClients
from orchestrator.tracing import publishing
from tool_workers.contract.connections import run_script_async
from tool_workers.contract.errors import DispatchError, ResultTimeout, ToolfleetError
from tool_workers.contract.marker import LUA_READ, marker_key
from tool_workers.contract.settings import Settings

log = logging.getLogger("toolfleet.dispatch")

PENDING_MARKER_TTL = 60
"""Seconds a RabbitMQ claim lives before its publication is confirmed."""

RETRY_SECONDS = 10.0
"""How long a publication of calls without a run deadline retries while Redis is
unreachable before it fails (calls with one retry until it)."""


class Outcome(enum.Enum):
    """What became of one call of a publication."""

    PUBLISHED = "published"
    """Its message is on the queue, sent by this publisher (now or by a lost earlier try)."""
    ATTACHED = "attached"
    """Someone else published it (another process, an earlier run): wait for theirs."""
    STORED = "stored"
    """Its result is stored already: nothing was sent."""


_PUSH = (
    LUA_READ
    + """
-- KEYS: per call its marker, its result key, its queue's list ('': claimed only, the
-- message goes out another way: RabbitMQ).
-- ARGV: marker lifetime, marker value, publisher token, then per call its message ('').
-- Per call: 1 claimed (and published), 2 result stored, 0 someone else's, 3 ours (an
-- earlier try).
local out = {}
for i = 1, #ARGV - 3 do
    local m, r, q = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
    if redis.call('SET', m, ARGV[2], 'NX', 'EX', ARGV[1]) then
        if redis.call('EXISTS', r) == 1 then
            if q == '' then
                redis.call('DEL', m)
            end
            out[i] = 2
        else
            if q ~= '' then
                redis.call('LPUSH', q, ARGV[i + 3])
            end
            out[i] = 1
        end
    else
        local marker = read_marker(m)
        out[i] = (marker and marker['t'] == ARGV[3]) and 3 or 0
    end
end
return out
"""
)
"""Claims each call in its marker and, on Redis, pushes its message in the same script:
one round trip for a whole publication. A call claimed only (RabbitMQ) is published
after, and a claim whose result is stored already is dropped."""

_MARK_SENT = (
    LUA_READ
    + """
-- KEYS: markers. ARGV: lifetime, token. A claim of ours becomes published (a worker
-- that started the call meanwhile wrote its own fields: those stay).
for _, m in ipairs(KEYS) do
    local marker = read_marker(m)
    if marker and marker['t'] == ARGV[2] and marker['p'] then
        marker['p'] = nil
        redis.call('SET', m, cjson.encode(marker), 'EX', ARGV[1])
    end
end
return 1
"""
)

_RELEASE = (
    LUA_READ
    + """
-- KEYS: markers. ARGV: token. Claims of ours whose publication failed are dropped.
for _, m in ipairs(KEYS) do
    local marker = read_marker(m)
    if marker and marker['t'] == ARGV[1] and marker['p'] then
        redis.call('DEL', m)
    end
end
return 1
"""
)

_REVOKE = (
    LUA_READ
    + """
-- KEYS: markers. ARGV: lifetime for a marker that is gone. Each call is recorded
-- cancelled, its other fields kept.
for _, m in ipairs(KEYS) do
    local marker = read_marker(m) or {}
    marker['r'] = 1
    local ttl = redis.call('TTL', m)
    if ttl < 1 then ttl = tonumber(ARGV[1]) end
    redis.call('SET', m, cjson.encode(marker), 'EX', ttl)
end
return 1
"""
)


Pushes = Generator[tuple[list[PreparedCall], list[str], list[Any]], Any, dict[str, Outcome]]
"""What :meth:`Publisher._pushes` is: push scripts to run, their replies sent back."""


@dataclass(eq=False)
class _Slot:
    """One call waiting in a sync batch."""

    call: PreparedCall
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Outcome | None = None
    error: BaseException | None = None


@dataclass
class _LoopBatch:
    """The calls of one event loop's next publication."""

    done: asyncio.Future[None]
    calls: list[PreparedCall] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    ended: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    """Set when the batch's publication has ended, however it ended (whoever still
    waits: a cancellation of one of its calls waits for this)."""


class Publisher:
    """Publishes calls for one dispatcher (thread-safe; any number of event loops).

    Args:
        settings: The fleet's settings (key prefix, signing key, result expiry).
        client: A Redis client of the markers' server (the result backend).
        loop_clients: That server's ``redis.asyncio`` client of each event loop.
        reply_to: The channel the workers report this process's calls on.
        result_key: Maps a task id to its result key (Celery's naming).
        queue_key: The Redis list a queue's messages go on (the broker's key prefix).
        default_queue: The queue of a call that names none.
        broker: RabbitMQ's side: ``None`` on a Redis broker.
        on_published: Told the outcome of every publication that succeeded (sync ones,
            and async batches whose callers may have been cancelled meanwhile).
        link: Where the publications note how Redis answers.
    """

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        loop_clients: LoopClients,
        reply_to: str,
        result_key: Callable[[str], str],
        queue_key: Callable[[str], str],
        default_queue: str,
        broker: AmqpBroker | None = None,
        on_published: Callable[[Mapping[str, Outcome]], None] | None = None,
        link: LinkHealth | None = None,
    ) -> None:
        self._settings = settings
        self._client = client
        self._loop_clients = loop_clients
        self.reply_to = reply_to
        self._result_key = result_key
        self._queue_key = queue_key
        self._default_queue = default_queue
        self._broker = broker
        self._on_published = on_published
        self.link = link if link is not None else LinkHealth()
        # Sync batches are published here, not in a caller's thread: a caller whose
        # deadline passes stops waiting while an attempt is still on the wire.
        self._leader = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="toolfleet-publish"
        )
        self._in_flight: dict[str, concurrent.futures.Future[None]] = {}
        """Calls of async batches being published, by task id: the batch's end."""
        self.epoch = ""
        """The epoch of toolfleet's records the messages name (:mod:`tool_workers.contract.epoch`;
        ``""``: not read yet). An older one than Redis's is safe: a worker then refuses
        a non-idempotent call of it only when its marker is gone too."""
        self._token = uuid.uuid4().hex
        self._marker_value = f'{{"t":"{self._token}"}}'
        self._pending_value = f'{{"t":"{self._token}","p":1}}'
        self._lock = threading.Lock()
        self._unmarked: set[str] = set()
        """RabbitMQ: calls published here whose marker still says ``pending``."""
        self._waiting: list[_Slot] = []
        self._leading = False
        self._batches: dict[asyncio.AbstractEventLoop, _LoopBatch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._push = client.register_script(_PUSH)
        self._mark_sent = client.register_script(_MARK_SENT)
        self._release = client.register_script(_RELEASE)
        self._revoke = client.register_script(_REVOKE)

    # -- sync --------------------------------------------------------------------------

    def publish(self, calls: Sequence[PreparedCall]) -> dict[str, Outcome]:
        """Publish the calls (with whatever else is waiting); blocks until they are out,
        or their run's deadline passed.

        Raises:
            DispatchError: the broker or Redis refused them (nothing of them is queued).
            ResultTimeout: the run's deadline passed first (a message that still goes
                out expires then: no worker runs it).
        """
        slots = [_Slot(call) for call in calls]
        with self._lock:
            self._waiting.extend(slots)
            lead = not self._leading
            self._leading = True
        if lead:
            try:
                self._leader.submit(self._lead)
            except RuntimeError as exc:  # closed
                with self._lock:
                    self._leading = False
                raise DispatchError("the dispatcher is closed") from exc
        until = _waits_until(calls)
        for slot in slots:
            left = None if until is None else max(until - time.monotonic(), 0.0)
            if not slot.done.wait(left):
                raise self._too_late(calls)
        for slot in slots:
            if slot.error is not None:
                raise _dispatch_error(slot.error, len(slots))
        outcomes = {slot.call.task_id: slot.outcome for slot in slots if slot.outcome is not None}
        if self._on_published is not None:
            self._on_published(outcomes)
        return outcomes

    def _lead(self) -> None:
        """Publish every waiting call, batch after batch, until none waits."""
        while True:
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._leading = False
                    return
            try:
                outcomes = self._publish_now([slot.call for slot in batch])
            except BaseException as exc:
                for slot in batch:
                    slot.error = exc
                    slot.done.set()
                if not isinstance(exc, Exception):
                    with self._lock:
                        self._leading = False
                    raise
                continue
            for slot in batch:
                slot.outcome = outcomes[slot.call.task_id]
                slot.done.set()

    def _publish_now(self, calls: Sequence[PreparedCall]) -> dict[str, Outcome]:
        if self._broker is not None:
            return self._publish_amqp(calls)
        pushes, replies = self._pushes(calls), None
        try:
            while True:
                group, keys, args = pushes.send(replies)
                push = functools.partial(self._push, keys=keys, args=args)
                replies = _retrying(push, _gives_up_at(group), self.link)
        except StopIteration as done:
            outcomes: dict[str, Outcome] = done.value
            return outcomes
        finally:
            pushes.close()  # a failed push leaves its group's trace context here

    def _pushes(self, calls: Sequence[PreparedCall]) -> Pushes:
        """The push scripts publishing ``calls`` on Redis, one group at a time: yields
        each group with the script's keys and arguments, is sent the script's replies,
        and returns every call's outcome. The one flow of the sync and async publishers
        (each runs the scripts its own way, retried within the group's window).

        A group whose messages are signalled (an instrumented process) is pushed with its
        call's trace context attached, and Celery's ``after_task_publish`` is sent for it.
        """
        outcomes: dict[str, Outcome] = {}
        for group, signalled in self._groups(calls):
            with publishing(group[0].trace if signalled else None):
                keys, args, messages = self._push_args(group, signalled)
                replies = yield group, keys, args
                if signalled:
                    after_publish(messages[0], self._queue(group[0]))
            outcomes.update(_outcomes(group, replies))
        return outcomes

    # -- async -------------------------------------------------------------------------

    async def publish_async(self, call: PreparedCall) -> Outcome:
        """Publish ``call`` with the calls of this loop's next batch.

        Raises:
            DispatchError: the broker or Redis refused them.
        """
        loop = asyncio.get_running_loop()
        batch = self._batches.get(loop)
        if batch is None:
            batch = _LoopBatch(loop.create_future())
            self._batches[loop] = batch
            # Two turns: every Send task of the superstep reaches this point first.
            loop.call_soon(self._later, loop, batch, 1)
        batch.calls.append(call)
        with self._lock:
            self._in_flight[call.task_id] = batch.ended
        # Shielded: a caller cancelled now (a sibling failed) still has its call's fate
        # decided with the batch; cancelling it then revokes what was published. A caller
        # whose deadline passes stops waiting (the message expires then).
        left = None if call.deadline is None else max(call.deadline - time.monotonic(), 0.0)
        try:
            await asyncio.wait_for(asyncio.shield(batch.done), left)
        except TimeoutError:
            raise self._too_late([call]) from None
        return batch.outcomes[call.task_id]

    def _too_late(self, calls: Sequence[PreparedCall]) -> ResultTimeout:
        why = self.link.describe() or "Redis did not answer in time"
        return ResultTimeout(f"{len(calls)} call(s) not published by the run's deadline: {why}")

    def close(self) -> None:
        """Stop the publisher's thread (a batch in progress ends on its own)."""
        self._leader.shutdown(wait=False)

    def _later(self, loop: asyncio.AbstractEventLoop, batch: _LoopBatch, turns: int) -> None:
        if turns > 0:
            loop.call_soon(self._later, loop, batch, turns - 1)
            return
        if self._batches.get(loop) is batch:
            del self._batches[loop]
        task = loop.create_task(self._flush(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: _LoopBatch) -> None:
        try:
            if self._broker is not None:
                io = self._broker.io
                outcomes = await asyncio.wrap_future(io.submit(self._publish_now, batch.calls))
            else:
                outcomes = await self._push_on_loop(batch.calls)
        except BaseException as exc:
            error = _dispatch_error(exc, len(batch.calls))
            self._ended(batch)
            if not batch.done.done():
                batch.done.set_exception(error)
                batch.done.exception()  # retrieved: a batch whose callers all left
            if not isinstance(exc, Exception):
                raise
            return
        batch.outcomes.update(outcomes)
        if self._on_published is not None:
            self._on_published(outcomes)
        self._ended(batch)
        if not batch.done.done():
            batch.done.set_result(None)

    def _ended(self, batch: _LoopBatch) -> None:
        with self._lock:
            for call in batch.calls:
                if self._in_flight.get(call.task_id) is batch.ended:
                    del self._in_flight[call.task_id]
        batch.ended.set_result(None)

    def publishing(self, task_ids: Sequence[str]) -> set[concurrent.futures.Future[None]]:
        """The ends of the async publications in progress that hold any of these calls."""
        with self._lock:
            return {self._in_flight[t] for t in task_ids if t in self._in_flight}

    async def _push_on_loop(self, calls: Sequence[PreparedCall]) -> dict[str, Outcome]:
        client = await self._loop_clients.get()
        pushes, replies = self._pushes(calls), None
        try:
            while True:
                group, keys, args = pushes.send(replies)
                push = functools.partial(run_script_async, client, self._push, keys, args)
                replies = await _retrying_async(push, _gives_up_at(group), self.link)
        except StopIteration as done:
            outcomes: dict[str, Outcome] = done.value
            return outcomes
        finally:
            pushes.close()  # a failed push leaves its group's trace context here

    # -- building ----------------------------------------------------------------------

    def _groups(self, calls: Sequence[PreparedCall]) -> list[tuple[list[PreparedCall], bool]]:
        """The calls in one group; one group per call when Celery's publish signals have
        listeners (each message published in its own call's trace context)."""
        if before_publish_listened():
            return [([call], True) for call in calls]
        return [(list(calls), False)]

    def _queue(self, call: PreparedCall) -> str:
        return call.queue or self._default_queue

    def message(self, call: PreparedCall) -> TaskMessage:
        """The call's task message, answered on this publisher's reply channel, naming
        the epoch of toolfleet's records this publisher knows."""
        return task_message(call, self.reply_to, self._settings.signing_key, self.epoch)

    def _push_args(
        self, calls: Sequence[PreparedCall], signalled: bool
    ) -> tuple[list[str], list[Any], list[TaskMessage]]:
        prefix = self._settings.key_prefix
        keys: list[str] = []
        args: list[Any] = [self._settings.result_expires, self._marker_value, self._token]
        messages = []
        for call in calls:
            queue = self._queue(call)
            message = self.message(call)
            if signalled:
                before_publish(message, queue)
            messages.append(message)
            keys += [
                marker_key(prefix, call.task_id),
                self._result_key(call.task_id),
                self._queue_key(queue),
            ]
            args.append(redis_envelope(message, queue))
        return keys, args, messages

    # -- RabbitMQ ----------------------------------------------------------------------

    def _publish_amqp(self, calls: Sequence[PreparedCall]) -> dict[str, Outcome]:
        assert self._broker is not None
        prefix = self._settings.key_prefix
        keys = [
            k
            for c in calls
            for k in (marker_key(prefix, c.task_id), self._result_key(c.task_id), "")
        ]
        args: list[Any] = [PENDING_MARKER_TTL, self._pending_value, self._token]
        args += [""] * len(calls)
        replies = _retrying(
            functools.partial(self._push, keys=keys, args=args), _gives_up_at(calls), self.link
        )
        outcomes = _outcomes(calls, replies)
        mine = [c for c in calls if outcomes[c.task_id] is Outcome.PUBLISHED]
        if not mine:
            return outcomes
        try:
            for group, signalled in self._groups(mine):
                with publishing(group[0].trace if signalled else None):
                    self._broker.send(
                        [(c, self.message(c), self._queue(c)) for c in group], signalled
                    )
        except Exception:
            self.release(mine)
            raise
        self._marked(mine)
        return outcomes

    def _marked(self, calls: Sequence[PreparedCall]) -> None:
        """Mark published calls ``sent``. Failing that they still run (their messages are
        queued): the marker stays ``pending`` and expires; :meth:`abandoned` knows."""
        prefix = self._settings.key_prefix
        keys = [marker_key(prefix, c.task_id) for c in calls]
        try:
            _retrying(
                lambda: self._mark_sent(
                    keys=keys, args=[self._settings.result_expires, self._token]
                ),
                _gives_up_at(calls),
                self.link,
            )
        except (redis.ConnectionError, redis.TimeoutError, ToolfleetError) as exc:
            log.warning(
                "%d published call(s) not marked sent (%r); their waiters check", len(calls), exc
            )
            with self._lock:
                self._unmarked.update(c.task_id for c in calls)

    def release(self, calls: Sequence[PreparedCall]) -> None:
        """Drop this publisher's claims of calls whose publication failed."""
        keys = [marker_key(self._settings.key_prefix, c.task_id) for c in calls]
        try:
            self._release(keys=keys, args=[self._token])
        except redis.RedisError:  # the claims expire on their own
            log.warning("could not release %d claim(s)", len(calls))

    # -- checks and revocations ----------------------------------------------------------

    def abandoned(self, call: PreparedCall) -> bool:
        """True when ``call`` has neither a marker nor a result: nobody will publish it
        (its claimer died, or Redis lost the marker).

        Raises:
            redis.RedisError: Redis did not answer.
        """
        if call.task_id in self._unmarked:
            self._marked([call])
            return False
        with self._client.pipeline(transaction=False) as pipe:
            pipe.exists(marker_key(self._settings.key_prefix, call.task_id))
            pipe.exists(self._result_key(call.task_id))
            marker, result = pipe.execute()
        return not marker and not result

    def record_revoked(self, task_ids: Sequence[str]) -> None:
        """Record the calls as cancelled in their markers (a worker starting one later
        answers ``cancelled`` and does not run it).

        Raises:
            redis.RedisError: Redis did not answer.
        """
        keys = [marker_key(self._settings.key_prefix, t) for t in task_ids]
        self._revoke(keys=keys, args=[self._settings.result_expires])


def before_publish_listened() -> bool:
    """Whether Celery's publish signals have listeners (an instrumented process)."""
    from celery import signals

    return bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers)


class AmqpBroker:
    """RabbitMQ's side of publishing: kombu producers with publisher confirms.

    Args:
        app: A Celery app of the fleet (its queue table names the broker's queues).
        io: Threads that run the blocking publications of async callers.
    """

    def __init__(self, app: Any, io: concurrent.futures.ThreadPoolExecutor) -> None:
        from kombu.pools import ProducerPool

        self.app = app
        self.io = io
        limit = app.conf.broker_pool_limit or 10
        self._connections: Any = app.connection_for_write().Pool(limit=limit)
        self._producers: Any = ProducerPool(self._connections, limit=limit)  # type: ignore[no-untyped-call]

    def send(self, batch: Sequence[tuple[PreparedCall, TaskMessage, str]], signalled: bool) -> None:
        """Publish the messages (each confirmed by RabbitMQ before this returns).

        Raises:
            kombu's OperationalError: RabbitMQ refused them.
        """
        queues = self.app.amqp.queues
        with self._producers.acquire(block=True) as producer:
            for _, message, queue in batch:
                target = queues[queue]
                if signalled:
                    before_publish(message, target.name)
                producer.publish(
                    message.body,
                    exchange="",
                    routing_key=target.name,
                    serializer="json",
                    delivery_mode=2,
                    declare=[target],
                    headers=message.headers,
                    retry=True,
                    retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
                    **message.properties,
                )
                if signalled:
                    after_publish(message, target.name)

    def close(self) -> None:
        """Close the producers' connections."""
        self._producers.force_close_all()
        self._connections.force_close_all()


def _outcomes(calls: Sequence[PreparedCall], replies: Sequence[Any]) -> dict[str, Outcome]:
    found = {}
    attached = 0
    for call, reply in zip(calls, replies, strict=True):
        code = int(reply)
        if code in (1, 3):
            found[call.task_id] = Outcome.PUBLISHED
        elif code == 2:
            found[call.task_id] = Outcome.STORED
        else:
            found[call.task_id] = Outcome.ATTACHED
            attached += 1
    if attached:
        log.info("%d call(s) already dispatched; attaching", attached)
    return found


def _dispatch_error(exc: BaseException, count: int) -> BaseException:
    if isinstance(exc, ToolfleetError) or not isinstance(exc, Exception):
        return exc
    return DispatchError(f"could not publish {count} tool call(s): {exc!r}")


def _waits_until(calls: Sequence[PreparedCall]) -> float | None:
    """Until when (monotonic) callers wait for these calls' publication: their runs'
    deadline; ``None`` (until it ends) when one has none."""
    deadlines = [c.deadline for c in calls]
    if not deadlines or any(d is None for d in deadlines):
        return None
    return max(d for d in deadlines if d is not None)


@dataclass(frozen=True)
class _Window:
    """Until when (monotonic) a publication retries, and whether that is its calls' run
    deadline (else the :data:`RETRY_SECONDS` of calls without one)."""

    until: float
    deadline: bool


def _gives_up_at(calls: Sequence[PreparedCall]) -> _Window:
    """How long a publication of ``calls`` retries: until the latest of their runs'
    deadlines, or :data:`RETRY_SECONDS` from now when one has none."""
    until = _waits_until(calls)
    if until is None:
        return _Window(time.monotonic() + RETRY_SECONDS, deadline=False)
    return _Window(until, deadline=True)


def _retrying(attempt: Callable[[], Any], window: _Window, link: LinkHealth) -> Any:
    """``attempt()``, tried again while Redis does not answer, until the window ends.

    Safe to repeat: a call an attempt whose reply was lost published is found marked
    with this publisher's token, and counts as published.
    """
    backoff = Backoff(until=window.until)
    while True:
        tried = time.monotonic()
        try:
            reply = attempt()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            time.sleep(_delay_or_raise(backoff, window, link, exc, tried))
        else:
            link.ok()
            return reply


async def _retrying_async(attempt: Callable[[], Any], window: _Window, link: LinkHealth) -> Any:
    """:func:`_retrying` on an event loop; no attempt outlasts the window."""
    backoff = Backoff(until=window.until)
    while True:
        tried = time.monotonic()
        try:
            async with asyncio.timeout_at(_loop_time(window.until)):
                reply = await attempt()
        except (redis.ConnectionError, redis.TimeoutError, TimeoutError) as exc:
            await asyncio.sleep(_delay_or_raise(backoff, window, link, exc, tried))
        else:
            link.ok()
            return reply


def _loop_time(monotonic: float) -> float:
    """The running loop's clock at the ``time.monotonic()`` instant ``monotonic``."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic - time.monotonic())


def _delay_or_raise(
    backoff: Backoff, window: _Window, link: LinkHealth, exc: Exception, tried: float
) -> float:
    """The delay before the next try after a failed one started at ``tried``, the last
    one shortened to end with the window; past it, the failure is raised, saying how
    long Redis has been unreachable: :class:`ResultTimeout` when the window was the
    run's deadline, else :class:`DispatchError`."""
    link.failed(exc, tried)
    if window.until <= time.monotonic():
        why = link.describe() or repr(exc)
        if window.deadline:
            raise ResultTimeout(f"not published by the run's deadline: {why}") from exc
        raise DispatchError(f"could not publish tool call(s): {why}") from exc
    delay = backoff.next()
    log.warning("Redis unreachable while dispatching; retrying in %.2fs", delay)
    return delay
