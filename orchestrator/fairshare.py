"""Fair shares of tool calls between the tenants of one process (``toolfleet serve``).

The service's runs are its tenants': each run's config carries its tenant under
``config["configurable"][TENANT_KEY]`` (set by the server, above anything a client or an
assistant gives). When the process has a :class:`CallGate` installed (``serve`` does),
the toolfleet middleware takes a turn from it before it publishes a call of such a run,
and gives the turn back when the call has ended: at most ``per_tenant`` calls of one
tenant, and ``total`` calls of all tenants, are in flight at once. A call beyond either
waits (it does not fail); the calls waiting get their turns tenant by tenant, round
robin, each tenant's in the order they came.

Why: the broker's queues are first come, first served. Without a gate, a tenant whose run
fans out to a hundred calls puts them all ahead of every other tenant's calls, which then
wait for the whole fan-out. With at most ``per_tenant`` of its calls on the broker, and
``per_tenant`` no more than the worker slots the tenants share, another tenant's call is
held back by at most one call of the first.

The gate is one process's: each replica of the service has its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TENANT_KEY = "__toolfleet_tenant"
"""Key of ``config["configurable"]`` naming the run's tenant (``__``: LangGraph copies
no such key into run metadata or traces)."""


def tenant_of(config: Mapping[str, Any]) -> str | None:
    """The tenant a run's config names, or ``None`` (not a run of the service)."""
    configurable = config.get("configurable") or {}
    found = configurable.get(TENANT_KEY)
    return found if isinstance(found, str) and found else None


@dataclass(eq=False)
class _Waiter:
    tenant: str
    wake: Callable[[], None]
    granted: bool = False


@dataclass
class _Tenant:
    in_flight: int = 0
    waiting: collections.deque[_Waiter] = field(default_factory=collections.deque)


class CallGate:
    """Turns for tool calls: at most ``per_tenant`` of one tenant's and ``total`` of all
    in flight at once; waiting calls served tenant by tenant, round robin.

    Thread-safe: async callers (:meth:`acquire`) and threads (:meth:`acquire_sync`) share
    the same turns.

    Args:
        per_tenant: Calls of one tenant in flight at once.
        total: Calls of every tenant in flight at once.
    """

    def __init__(self, per_tenant: int, total: int) -> None:
        if per_tenant < 1 or total < 1:
            raise ValueError("a gate lets at least one call through")
        self.per_tenant = per_tenant
        self.total = total
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}
        self._turns: collections.deque[str] = collections.deque()
        """Tenants with waiting calls, the next to be served first."""
        self._in_flight = 0

    # -- taking and giving back turns ------------------------------------------------

    async def acquire(self, tenant: str, timeout: float | None = None) -> bool:
        """Wait for a turn of ``tenant``'s; ``False`` if ``timeout`` seconds passed first.

        A caller cancelled while it waits leaves the line (a turn it was given just then
        is given back).
        """
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, turn)

        waiter = self._enter(tenant, wake)
        if waiter is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(turn), timeout)
        except TimeoutError:
            return self._leave(waiter)
        except asyncio.CancelledError:
            if self._leave(waiter):
                self.release(tenant)
            raise
        return True

    def acquire_sync(self, tenant: str, timeout: float | None = None) -> bool:
        """:meth:`acquire` for a thread: blocks it until its turn (or ``timeout``)."""
        event = threading.Event()
        waiter = self._enter(tenant, event.set)
        if waiter is None:
            return True
        if event.wait(timeout):
            return True
        return self._leave(waiter)

    def release(self, tenant: str) -> None:
        """Give back a turn of ``tenant``'s; the next waiting call gets it."""
        wakes: list[Callable[[], None]] = []
        with self._lock:
            state = self._tenants.get(tenant)
            if state is None or state.in_flight <= 0:
                return
            state.in_flight -= 1
            self._in_flight -= 1
            wakes = self._hand_out()
            self._drop_if_idle(tenant)
        for wake in wakes:
            wake()

    # -- what a scrape shows ---------------------------------------------------------

    def in_flight(self) -> dict[str, int]:
        """Calls in flight, per tenant with any."""
        with self._lock:
            return {t: s.in_flight for t, s in self._tenants.items() if s.in_flight}

    def waiting(self) -> dict[str, int]:
        """Calls waiting for a turn, per tenant with any."""
        with self._lock:
            return {t: len(s.waiting) for t, s in self._tenants.items() if s.waiting}

    # -- the line ----------------------------------------------------------------------

    def _enter(self, tenant: str, wake: Callable[[], None]) -> _Waiter | None:
        """A turn at once (``None``), or the caller's place in the line."""
        with self._lock:
            state = self._tenants.setdefault(tenant, _Tenant())
            if not state.waiting and self._free(state):
                state.in_flight += 1
                self._in_flight += 1
                return None
            waiter = _Waiter(tenant, wake)
            state.waiting.append(waiter)
            if tenant not in self._turns:
                self._turns.append(tenant)
            return waiter

    def _leave(self, waiter: _Waiter) -> bool:
        """Take ``waiter`` out of the line; ``True`` if it had been given a turn (it
        holds it now: the caller keeps or gives it back)."""
        with self._lock:
            if waiter.granted:
                return True
            state = self._tenants.get(waiter.tenant)
            if state is not None and waiter in state.waiting:
                state.waiting.remove(waiter)
                if not state.waiting and waiter.tenant in self._turns:
                    self._turns.remove(waiter.tenant)
                self._drop_if_idle(waiter.tenant)
            return False

    def _free(self, state: _Tenant) -> bool:
        return state.in_flight < self.per_tenant and self._in_flight < self.total

    def _hand_out(self) -> list[Callable[[], None]]:
        """Give free turns to waiting calls, one tenant after another (lock held)."""
        wakes: list[Callable[[], None]] = []
        skipped = 0
        while self._turns and self._in_flight < self.total and skipped < len(self._turns):
            tenant = self._turns[0]
            state = self._tenants[tenant]
            if state.in_flight >= self.per_tenant or not state.waiting:
                self._turns.rotate(-1)
                skipped += 1
                continue
            waiter = state.waiting.popleft()
            waiter.granted = True
            state.in_flight += 1
            self._in_flight += 1
            wakes.append(waiter.wake)
            self._turns.popleft()
            if state.waiting:
                self._turns.append(tenant)  # its next call waits for the others' turns
            skipped = 0
        return wakes

    def _drop_if_idle(self, tenant: str) -> None:
        state = self._tenants.get(tenant)
        if state is not None and not state.in_flight and not state.waiting:
            del self._tenants[tenant]


def _settle(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)


_installed: CallGate | None = None


def install(gate: CallGate | None) -> None:
    """Make ``gate`` the process's (``None``: no gate): the middleware takes turns from
    it for every call of a run whose config names a tenant."""
    global _installed
    _installed = gate


def installed() -> CallGate | None:
    """The process's gate, if one is installed."""
    return _installed
