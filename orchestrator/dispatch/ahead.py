"""Calls published ahead of their own hook: a sync fan-out at the fleet's width.

A sync run calls the tool hook from LangGraph's thread pool, ``max_concurrency`` threads
(``min(32, cpu + 4)`` by default), so a fan-out wider than the pool would reach the
workers in waves. The first hook of an AIMessage's fan-out publishes its siblings' calls
that are safe to run early (idempotent, nothing injected, the run untraced: see
docs/concepts.md) in one batch; each sibling's own hook then claims its call and only
waits for a result already on its way.

An early call whose own hook never comes (an outer middleware refused it, a sibling
failed and the run ended, the run was interrupted) is revoked and its result discarded
once no hook of its fan-out has run for :data:`ABANDON_AFTER` seconds.

:class:`Ahead` keeps, per fan-out (its call site's scope), which hooks came, which calls
went out early and which of those are not claimed yet; it never publishes a call whose
hook has already come, so a call is published by its own hook or ahead, never both.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.call import PreparedCall
from orchestrator.dispatch.base import Dispatcher
from orchestrator.dispatch.watch import StateCallback

log = logging.getLogger("toolfleet.orchestrator")

ABANDON_AFTER = 2.0
"""Seconds in which no hook of a fan-out started or ended, after which its unclaimed
early calls are revoked: their hooks will not come."""

GROUPS = 1024
"""Fan-outs remembered (a fan-out is led once, and a resumed one is not led again)."""


@dataclass(eq=False)
class Early:
    """One call published ahead of its hook."""

    call: PreparedCall
    published: threading.Event = field(default_factory=threading.Event)
    failed: bool = False
    events: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    """State changes heard before its hook claimed it (replayed to the hook's observer)."""
    on_state: StateCallback | None = None


@dataclass(eq=False)
class _Group:
    arrived: set[str] = field(default_factory=set)
    """Call ids whose own hook has come."""
    unclaimed: dict[str, Early] = field(default_factory=dict)
    """Early calls by call id, their hooks not come yet."""
    running: int = 0
    """Hooks of this fan-out running now."""
    last: float = 0.0
    """When a hook of this fan-out last started or ended (``time.monotonic()``)."""
    led: bool = False
    armed: bool = False


@dataclass(eq=False)
class Ticket:
    """A hook's entry into its fan-out (see :meth:`Ahead.enter`)."""

    scope: str | None
    early: Early | None = None
    """The hook's call, if it was published ahead (the hook claimed it on entry)."""
    used: bool = False
    """Whether the hook waited for its early call (else :meth:`Ahead.leave` revokes it)."""


class Ahead:
    """Publishes a fan-out's early calls and hands each to its own hook.

    Args:
        dispatcher: Publishes and revokes the calls.
        abandon_after: See :data:`ABANDON_AFTER`.
    """

    def __init__(self, dispatcher: Dispatcher, *, abandon_after: float | None = None) -> None:
        self._dispatcher = dispatcher
        self._abandon_after = ABANDON_AFTER if abandon_after is None else abandon_after
        self._lock = threading.Lock()
        self._groups: collections.OrderedDict[str, _Group] = collections.OrderedDict()
        self._by_task: dict[str, Early] = {}

    # -- a hook's life -----------------------------------------------------------------

    def enter(self, scope: str | None, call_id: str) -> Ticket:
        """A hook of fan-out ``scope`` starts for ``call_id``; its early call, if any, is
        claimed (no abandonment revokes it any more). Pair with :meth:`leave`."""
        if scope is None:
            return Ticket(None)
        with self._lock:
            group = self._group(scope)
            group.arrived.add(call_id)
            group.running += 1
            group.last = time.monotonic()
            return Ticket(scope, group.unclaimed.pop(call_id, None))

    def leave(self, ticket: Ticket) -> None:
        """The hook ended. Its early call, if it did not wait for it (the call was routed
        elsewhere since, or the hook failed first), is revoked."""
        if ticket.scope is None:
            return
        early = ticket.early
        with self._lock:
            if early is not None:
                self._by_task.pop(early.call.task_id, None)
            group = self._groups.get(ticket.scope)
            if group is not None:
                group.running -= 1
                group.last = time.monotonic()
                arm = group.running == 0 and bool(group.unclaimed) and not group.armed
                group.armed = group.armed or arm
            else:
                arm = False
        if early is not None and not ticket.used:
            self._revoke([early])
        if arm:
            self._arm(ticket.scope, self._abandon_after)

    def lead(self, scope: str | None) -> bool:
        """Whether the caller is the first hook of ``scope`` to ask (it publishes ahead)."""
        if scope is None:
            return False
        with self._lock:
            group = self._group(scope)
            if group.led:
                return False
            group.led = True
            return True

    # -- publishing ahead --------------------------------------------------------------

    def publish(self, scope: str, calls: Iterable[PreparedCall]) -> int:
        """Publish the calls of fan-out ``scope`` whose hooks have not come yet, in one
        batch; returns how many went out. A failed publication is left to the hooks.
        """
        with self._lock:
            group = self._group(scope)
            fresh = [
                Early(c)
                for c in calls
                if c.call_id not in group.arrived and c.call_id not in group.unclaimed
            ]
            for early in fresh:
                group.unclaimed[early.call.call_id] = early
                self._by_task[early.call.task_id] = early
        if not fresh:
            return 0
        batch = [e.call for e in fresh]
        timings = self._dispatcher.timings
        if timings is not None:
            timings.publishing(batch)
        try:
            self._dispatcher.submit(batch, self._on_state)
        except Exception as exc:  # each hook publishes its own call instead
            log.warning("could not publish %d call(s) ahead: %r", len(batch), exc)
            self._failed(scope, fresh)
            return 0
        finally:
            for early in fresh:
                early.published.set()
        return len(fresh)

    def attach(self, ticket: Ticket, on_state: StateCallback) -> bool:
        """Hand the ticket's early call to its hook: wait for its publication, then
        replay and forward its state changes to ``on_state``. ``False``: there is none,
        or its publication failed (the hook publishes the call itself)."""
        early = ticket.early
        if early is None:
            return False
        early.published.wait()
        if early.failed:
            return False
        with self._lock:
            heard, early.events = early.events, []
            early.on_state = on_state
        for task_id, state, meta in heard:
            on_state(task_id, state, meta)
        ticket.used = True
        return True

    # -- internals ---------------------------------------------------------------------

    def _group(self, scope: str) -> _Group:
        group = self._groups.get(scope)
        if group is None:
            group = self._groups[scope] = _Group()
            while len(self._groups) > GROUPS:
                _, old = self._groups.popitem(last=False)
                if old.unclaimed:  # a fan-out long gone: nothing will claim these
                    self._revoke(list(old.unclaimed.values()))
        self._groups.move_to_end(scope)
        return group

    def _on_state(self, task_id: str, state: str | None, meta: dict[str, Any]) -> None:
        with self._lock:
            early = self._by_task.get(task_id)
            if early is None:
                return
            forward = early.on_state
            if forward is None:
                early.events.append((task_id, state, meta))
                return
        forward(task_id, state, meta)

    def _failed(self, scope: str, fresh: Sequence[Early]) -> None:
        with self._lock:
            group = self._groups.get(scope)
            for early in fresh:
                early.failed = True
                self._by_task.pop(early.call.task_id, None)
                if group is not None:
                    group.unclaimed.pop(early.call.call_id, None)

    def _arm(self, scope: str, delay: float) -> None:
        timer = threading.Timer(delay, self._abandon, (scope,))
        timer.daemon = True
        timer.start()

    def _abandon(self, scope: str) -> None:
        """Revoke the fan-out's unclaimed calls if no hook of it started or ended for
        the whole abandonment time (hooks that each return at once leave none running
        between them, again and again, while the fan-out goes on); else look again when
        that time has passed since the last one."""
        with self._lock:
            group = self._groups.get(scope)
            if group is None:
                return
            group.armed = False
            if group.running > 0 or not group.unclaimed:
                return  # the hook running now arms it again as it leaves
            quiet = time.monotonic() - group.last
            if quiet < self._abandon_after:
                group.armed = True
                self._arm(scope, self._abandon_after - quiet)
                return
            left = list(group.unclaimed.values())
            group.unclaimed.clear()
        log.info(
            "revoking %d call(s) published ahead whose own tool hook never came",
            len(left),
        )
        self._revoke(left)

    def _revoke(self, early: list[Early]) -> None:
        # Called with or without the lock held: the revocation runs on a thread of its
        # own, after the calls' publication ended (a failed one revokes nothing).
        def revoke() -> None:
            for e in early:
                e.published.wait()
            calls = [e.call for e in early if not e.failed]
            if calls:
                self._dispatcher.cancel(calls, terminate=True)

        for e in early:
            self._by_task.pop(e.call.task_id, None)
        threading.Thread(target=revoke, name="toolfleet-ahead-revoke", daemon=True).start()
