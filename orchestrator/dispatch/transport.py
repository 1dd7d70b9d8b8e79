"""What every dispatcher shares, over a narrow transport seam.

Watching a call, waiting for it (its deadline, its idle timeout), reading its answer
and cancelling it are decided here, once, for every dispatcher. What differs between
Celery (over Redis or RabbitMQ, :mod:`.dispatcher`) and running in this process
(:mod:`.in_process`) is a transport, which only:

* sends a batch of calls (:meth:`TransportDispatcher._send`, and
  :meth:`~TransportDispatcher._send_async` for one call of an event loop), says what
  became of each (:class:`~orchestrator.dispatch.publish.Outcome`) and reports the
  calls it sent to :meth:`~TransportDispatcher._published`;
* hands each call's states, as the Celery metas a result backend holds, into the watch
  table it was made with (:attr:`TransportDispatcher.results`), and reads those of
  calls it did not send now (:meth:`~TransportDispatcher._read_now`);
* revokes calls it sent (:meth:`~TransportDispatcher._revoke_sent`);
* and answers the registry's questions (the tools it serves).

Sync and async callers share every decision; they differ only in how they wait and
where their I/O runs: a sync caller in its own thread, an async caller on its event
loop, with the blocking round trips a transport needs in this dispatcher's two I/O
threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NoReturn, Protocol, TypeVar

from orchestrator.call import PreparedCall
from orchestrator.dispatch.outcome import result_from_meta
from orchestrator.dispatch.publish import Outcome
from orchestrator.dispatch.timings import CallTimings
from orchestrator.dispatch.waiting import Next, Waiting, deadline_of
from orchestrator.dispatch.watch import StateCallback
from tool_workers.contract.errors import DispatchError, ToolfleetError
from tool_workers.contract.models import ToolResult
from tool_workers.contract.settings import Settings, ToolPolicies

T = TypeVar("T")

SENT_MEMORY = 65_536
"""Published calls remembered for their cancellation (flat memory, however many calls)."""

VERDICT = "TOOLFLEET_VERDICT"
"""State of a meta a transport resolves a call's future with itself (its ``verdict``, a
:class:`ToolResult`, is the answer): a Celery call whose records Redis lost."""

REVOKE_WAIT = 1.0
"""Seconds a cancellation waits for its revocation (a round trip when Redis answers);
past that it goes on in the background, so a cut never holds up a run's end."""


class Results(Protocol):
    """Where a transport hands its calls' states: futures per watched call."""

    def watch(
        self, task_ids: Iterable[str], on_state: StateCallback | None = None
    ) -> dict[str, concurrent.futures.Future[dict[str, Any]]]:
        """Futures resolving to each call's ready meta."""
        ...

    def release(self, task_id: str) -> None:
        """Drop one watch of ``task_id``."""
        ...

    def last_activity(self, task_id: str) -> float | None:
        """When (monotonic) a started call last showed life; ``None`` if not started."""
        ...

    def close(self) -> None:
        """Drop every watch."""
        ...


class TransportDispatcher:
    """The shared half of a dispatcher: a subclass is its transport.

    Args:
        settings: This process's settings.
        policies: The tool policy.
        results: The watch table the transport hands states into.
    """

    timings: CallTimings | None = None
    """Set to time this process's calls (``toolfleet serve``'s ``/metrics``)."""

    def __init__(self, settings: Settings, policies: ToolPolicies, results: Results) -> None:
        self.settings = settings
        self.policies = policies
        self.results = results
        # Blocking round trips of async callers: threads of their own, never the loop.
        self._io = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="toolfleet-io"
        )
        self._lock = threading.Lock()
        self._futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        self._calls: dict[str, PreparedCall] = {}
        self._sent: collections.OrderedDict[str, str] = collections.OrderedDict()
        """Calls this process published (or found published), with the epoch their
        messages named: the ones a cancellation revokes. The most recent
        :data:`SENT_MEMORY`."""

    # -- the transport: what a subclass implements -----------------------------------------

    def _send(self, calls: Sequence[PreparedCall]) -> Mapping[str, Outcome]:
        """Send the calls; returns once they are out (blocking)."""
        raise NotImplementedError

    async def _send_async(self, call: PreparedCall) -> Outcome:
        """Send ``call`` without blocking the event loop."""
        raise NotImplementedError

    def _read_now(self, task_ids: Sequence[str]) -> None:
        """Hand in the states of calls sent by someone else, or answered already."""
        raise NotImplementedError

    def _revoke_sent(self, task_ids: Sequence[str], terminate: bool) -> None:
        """Revoke calls this dispatcher sent (in an I/O thread)."""
        raise NotImplementedError

    def _publishing(self, task_ids: Sequence[str]) -> Collection[concurrent.futures.Future[None]]:
        """The sends of these calls still in progress (a cancellation waits for them)."""
        return ()

    def _epoch(self) -> str:
        """The epoch of the records the calls sent now name (``""``: none)."""
        return ""

    async def _before_watch_async(self) -> None:
        """Ready the transport before an async caller's first watch (off the loop)."""

    def _before_send(self, calls: Sequence[PreparedCall]) -> None:
        """Ready the transport for a sync send."""

    async def _before_send_async(self, call: PreparedCall) -> None:
        """Ready the transport for an async send (off the loop)."""

    def _check_soon(self, call: PreparedCall) -> None:
        """A waiter's periodic check that someone still owns ``call`` (never blocks)."""

    def link_trouble(self) -> str | None:
        """What is wrong with the transport's link now, if anything."""
        return None

    def _answered(self, call: PreparedCall, result: ToolResult) -> None:
        """``call`` was answered ``result`` (a transport notes what it must of it)."""

    # -- publishing -----------------------------------------------------------------------

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Send every call this process does not wait on yet; returns once they are out.

        Raises:
            DispatchError: the broker refused them.
        """
        fresh = self._watch(calls, on_state)
        if not fresh:
            return
        self._before_send(fresh)
        try:
            outcomes = self._send(fresh)
        except BaseException as exc:
            self._publication_failed(fresh)
            _raise_as_dispatch_error(exc)
        self._after(outcomes)

    async def submit_async(self, call: PreparedCall, on_state: StateCallback | None = None) -> None:
        """Send ``call`` together with the calls of the same loop turns.

        Raises:
            DispatchError: the broker refused them.
        """
        await self._before_watch_async()
        if not self._watch([call], on_state):
            return
        await self._before_send_async(call)
        try:
            # The publication is the batch's: it goes on if this caller is cancelled (a
            # cancellation of the call waits for its end).
            outcome = await self._send_async(call)
        except BaseException as exc:
            self._publication_failed([call])
            _raise_as_dispatch_error(exc)
        self._after({call.task_id: outcome})

    def _watch(
        self, calls: Sequence[PreparedCall], on_state: StateCallback | None
    ) -> list[PreparedCall]:
        """Start watching the calls not watched yet: those are the ones to send."""
        with self._lock:
            fresh = [c for c in calls if c.task_id not in self._futures]
            if not fresh:
                return []
            futures = self.results.watch([c.task_id for c in fresh], on_state)
            self._futures.update(futures)
            self._calls.update((c.task_id, c) for c in fresh)
        return fresh

    def _published(self, outcomes: Mapping[str, Outcome]) -> None:
        """Calls on the queue now: the ones a cancellation revokes (the transport tells
        every send that succeeded, even one whose caller was cancelled meanwhile)."""
        epoch = self._epoch()
        with self._lock:
            for task_id, outcome in outcomes.items():
                if outcome is Outcome.STORED:
                    continue
                self._sent[task_id] = epoch
                self._sent.move_to_end(task_id)
            while len(self._sent) > SENT_MEMORY:
                self._sent.popitem(last=False)

    def _publication_failed(self, calls: Sequence[PreparedCall]) -> None:
        """Stop waiting on calls whose publication failed (or whose caller was cancelled
        while it went on: its end decides whether a cancellation revokes them)."""
        for call in calls:
            self._forget(call.task_id)

    def _after(self, outcomes: Mapping[str, Outcome]) -> None:
        """Calls sent by someone else, or answered already: read their states now."""
        elsewhere = [t for t, o in outcomes.items() if o is not Outcome.PUBLISHED]
        if elsewhere:
            self._read_now(elsewhere)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    # -- waiting --------------------------------------------------------------------------

    def _future(self, call: PreparedCall) -> concurrent.futures.Future[dict[str, Any]]:
        with self._lock:
            future = self._futures.get(call.task_id)
        if future is None:
            self.submit([call])
            with self._lock:
                future = self._futures[call.task_id]
        return future

    def wait(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Block until the call's result is in (sending it first if need be).

        A call whose policy has an ``idle_timeout`` and that shows no life for that long
        once started is revoked and answered as hung.

        Raises:
            ResultTimeout: no result by the call's deadline or within ``timeout``.
        """
        future = self._future(call)
        waiting = self._waiting(call, timeout)
        try:
            while True:
                try:
                    meta = future.result(waiting.step())
                    break
                except concurrent.futures.TimeoutError:
                    given_up = self._between(call, waiting)
                    if given_up is not None:
                        self._revoke([call.task_id], terminate=True)
                        return given_up
        finally:
            self._forget(call.task_id)
        return self._result(call, meta)

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await the call's result on the running event loop (see :meth:`wait`).

        Raises:
            ResultTimeout: no result by the call's deadline or within ``timeout``.
        """
        with self._lock:
            watched = call.task_id in self._futures
        if not watched:  # never submitted (a RemoteTool invoked directly): send it now
            await self.submit_async(call)
        future = asyncio.wrap_future(self._future(call))
        waiting = self._waiting(call, timeout)
        try:
            while True:
                # asyncio.wait, unlike wait_for, neither wraps the future in a task nor
                # cancels it on a timeout.
                await asyncio.wait((future,), timeout=waiting.step())
                if future.done():
                    meta = future.result()
                    break
                given_up = self._between(call, waiting)
                if given_up is not None:
                    await self._off_loop(self._revoke, [call.task_id], True)
                    return given_up
        finally:
            self._forget(call.task_id)
        return self._result(call, meta)

    def _between(self, call: PreparedCall, waiting: Waiting) -> ToolResult | None:
        """A wait's step ran out: the answer to give up with (the call is then revoked),
        or None to wait on (its ownership checked soon when the wait says so)."""
        move = waiting.between()
        if move is Next.CHECK:
            self._check_soon(call)
        return move if isinstance(move, ToolResult) else None

    def _waiting(self, call: PreparedCall, timeout: float | None) -> Waiting:
        return Waiting(
            call,
            deadline_of(call, timeout),
            lambda: self.results.last_activity(call.task_id),
            self.link_trouble,
        )

    def _result(self, call: PreparedCall, meta: dict[str, Any]) -> ToolResult:
        """The answer in a call's ready meta (its signature checked with a signing key),
        or the one the transport decided itself (:data:`VERDICT`)."""
        verdict = meta.get("verdict") if meta.get("status") == VERDICT else None
        if isinstance(verdict, ToolResult):
            result = verdict
        else:
            result = result_from_meta(
                meta,
                call.tool,
                call.spec,
                task_id=call.task_id,
                signing_key=self.settings.signing_key,
            )
        self._answered(call, result)
        return result

    def _forget(self, task_id: str) -> None:
        if self.timings is not None:
            self.timings.forget(task_id)
        with self._lock:
            self._calls.pop(task_id, None)
            if self._futures.pop(task_id, None) is None:
                return
        self.results.release(task_id)

    # -- stopping -------------------------------------------------------------------------

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Revoke the calls (terminating them on prefork workers) and stop waiting.

        Waits :data:`REVOKE_WAIT` at most for the revocation: during a cut it goes on in
        the background (a run's deadline is kept; the calls' messages expire with it).
        """
        revoking = self._stop(calls, terminate)
        if revoking is not None:
            concurrent.futures.wait((revoking,), timeout=REVOKE_WAIT)

    async def cancel_async(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """:meth:`cancel`, its round trips off the event loop.

        Handed to the I/O threads before the first await: a caller cancelled again while
        it waits (a run torn down, a loop shutting down) does not stop the revocation.
        Waits :data:`REVOKE_WAIT` at most, as :meth:`cancel` does.
        """
        revoking = self._stop(calls, terminate)
        if revoking is not None:
            # asyncio.wait neither cancels the revocation nor raises on a timeout.
            await asyncio.wait((asyncio.wrap_future(revoking),), timeout=REVOKE_WAIT)

    def _stop(
        self, calls: Sequence[PreparedCall], terminate: bool
    ) -> concurrent.futures.Future[None] | None:
        """Start revoking the calls and stop waiting for them; the revocation, if any."""
        ids = [c.task_id for c in calls]
        if not ids:
            return None
        revoking = self._revoking(ids, terminate)
        for task_id in ids:
            self._forget(task_id)
        return revoking

    def _revoking(self, ids: list[str], terminate: bool) -> concurrent.futures.Future[None] | None:
        """The revocation of ``ids``, started in the I/O threads (``None``: closed)."""
        try:
            return self._io.submit(self._revoke, ids, terminate)
        except RuntimeError:  # closed: nothing runs for this process any more
            return None

    def _revoke(self, ids: list[str], terminate: bool) -> None:
        ids = self._revocable(ids)
        if not ids:
            return
        with self._lock:
            for task_id in ids:
                self._sent.pop(task_id, None)
        self._revoke_sent(ids, terminate)

    def _revocable(self, ids: Sequence[str]) -> list[str]:
        """The calls a cancellation must revoke: those this process sent, once the
        sends in progress for any of them have ended.

        A call whose send failed, or that was never sent (its run was cancelled first),
        is not on the queue because of this process: a revocation recorded for it would
        answer it "cancelled" when the run is resumed.
        """
        concurrent.futures.wait(self._publishing(ids))
        with self._lock:
            return [t for t in ids if t in self._sent]

    def in_flight(self) -> int:
        """Calls this process is waiting on."""
        with self._lock:
            return len(self._futures)

    def data_losses(self) -> int:
        """Losses of the transport's records this process noticed (none by default)."""
        return 0

    def close(self) -> None:
        """Stop waiting for anything and release the I/O threads."""
        self.results.close()
        self._io.shutdown(wait=False)


def _raise_as_dispatch_error(exc: BaseException) -> NoReturn:
    """Raise ``exc``; an error of the broker or Redis as a :class:`DispatchError`."""
    if isinstance(exc, ToolfleetError) or not isinstance(exc, Exception):
        raise exc
    raise DispatchError(f"could not publish tool call(s): {exc!r}") from exc
