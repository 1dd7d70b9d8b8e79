"""The wait for one call's result: every decision in one place, sync and async alike.

A waiter blocks (sync) or awaits (async) the call's future for :meth:`Waiting.step`
seconds at a time; between steps it asks :meth:`Waiting.between` what to do: give up
(the deadline passed), answer a hung call (its idle timeout), check that someone still
owns the call, or simply wait on. The two shells in
:class:`~orchestrator.dispatch.transport.TransportDispatcher` only differ in how they wait
and where their I/O runs.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

from orchestrator.call import PreparedCall
from orchestrator.messages import hung_text
from tool_workers.contract.errors import ResultTimeout
from tool_workers.contract.models import ToolResult

log = logging.getLogger("toolfleet.dispatch")

CHECK_INTERVAL = 5.0
"""Seconds between a waiter's checks that its call is still owned by someone."""


class Next(enum.Enum):
    """What a waiter does after a step without a result."""

    WAIT = "wait"
    CHECK = "check"
    """Check that the call is still published (republish one nobody will)."""


class Waiting:
    """One wait for ``call``'s result.

    Args:
        call: The call waited for.
        deadline: ``time.monotonic()`` by which the result must be in (``None``: none).
        last_activity: When the call last showed life (its start, progress, heartbeats),
            ``None`` before it started.
        trouble: What is wrong with the link to Redis now, if anything (named by the
            error raised when the deadline passes).
    """

    def __init__(
        self,
        call: PreparedCall,
        deadline: float | None,
        last_activity: Callable[[], float | None],
        trouble: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.call = call
        self.deadline = deadline
        self._last_activity = last_activity
        self._trouble = trouble
        self._next_check = time.monotonic() + CHECK_INTERVAL

    def step(self) -> float:
        """Seconds to wait for the result before the next decision: the ownership check,
        the idle timeout and the deadline, whichever comes first."""
        now = time.monotonic()
        step = max(self._next_check - now, 0.0)
        idle = self.call.idle_timeout
        if idle is not None:
            step = min(step, max(idle / 4, 0.05))
        if self.deadline is not None:
            step = min(step, max(self.deadline - now, 0.0))
        return step

    def between(self) -> Next | ToolResult:
        """After a step without a result: the next move, or the answer of a hung call
        (the caller revokes it).

        Raises:
            ResultTimeout: the deadline passed.
        """
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            trouble = self._trouble()
            why = f": {trouble}" if trouble else ""
            raise ResultTimeout(f"no result for {self.call.tool} call {self.call.call_id}{why}")
        idle = self.call.idle_timeout
        if idle is not None:
            last = self._last_activity()
            if last is not None and now - last >= idle:
                log.warning(
                    "call %s to %s silent for %gs: revoking it",
                    self.call.call_id,
                    self.call.tool,
                    idle,
                )
                return ToolResult.error("hung", hung_text(self.call.tool, idle))
        if now >= self._next_check:
            self._next_check = now + CHECK_INTERVAL
            return Next.CHECK
        return Next.WAIT


def deadline_of(call: PreparedCall, timeout: float | None) -> float | None:
    """The earlier of the call's run deadline and ``timeout`` seconds from now."""
    ends = [d for d in (call.deadline,) if d is not None]
    if timeout is not None:
        ends.append(time.monotonic() + timeout)
    return min(ends) if ends else None
