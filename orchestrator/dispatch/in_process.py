"""An in-process dispatcher: runs tools in threads of this process, no broker.

The one module of the orchestrator that imports the worker's execution code
(:mod:`tool_workers.runtime.execute`, :mod:`tool_workers.runtime.tasks`): it *is* a
worker, in-process.

For fast tests of agents (and of toolfleet itself): the same middleware and
the same results as with real workers, without Redis. Each call
still runs at most once per task id, as with the Celery dispatcher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from langchain_core.tools import BaseTool

from orchestrator.call import PreparedCall
from orchestrator.dispatch.base import PlacementTable
from orchestrator.dispatch.timings import CallTimings
from orchestrator.dispatch.waiting import deadline_of
from orchestrator.dispatch.watch import StateCallback
from orchestrator.messages import not_served_there_text
from tool_workers.contract.errors import ResultTimeout
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.settings import Settings, ToolPolicies
from tool_workers.runtime.execute import Limits, run_call
from tool_workers.runtime.tasks import tool_spec


class InProcessDispatcher:
    """Runs calls on a thread pool here; counts how often each task id was published.

    Args:
        tools: The tools to serve.
        policies: Per-tool policy (queues and limits shown in the specs).
        max_workers: Threads running tools concurrently.
    """

    timings: CallTimings | None = None
    """Calls run here report no timings."""

    def __init__(
        self,
        tools: Sequence[BaseTool],
        policies: ToolPolicies | None = None,
        max_workers: int = 64,
        settings: Settings | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.policies = policies if policies is not None else self.settings.policies()
        self._tools = {tool.name: tool for tool in tools}
        self._specs = {
            tool.name: tool_spec(tool, self.policies.for_tool(tool.name)) for tool in tools
        }
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="toolfleet-inprocess"
        )
        self._lock = threading.Lock()
        self._futures: dict[str, concurrent.futures.Future[ToolResult]] = {}
        self._calls: dict[str, PreparedCall] = {}
        self.published: Counter[str] = Counter()
        """How many times each task id was handed to the pool (always 0 or 1)."""
        self.cancelled: list[str] = []
        """Task ids :meth:`cancel` was asked to revoke."""
        self.placements: list[PlacementTable] = []
        """Every tool placement :meth:`note_placement` was given."""
        self._revoked: set[str] = set()

    def served_tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Every tool given to the constructor."""
        return self._specs

    async def served_tools_async(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Every tool given to the constructor."""
        return self._specs

    def served_versions(self, name: str) -> Mapping[str, ToolSpec]:
        """The one version of ``name`` given to the constructor (empty: none)."""
        spec = self._specs.get(name)
        return {} if spec is None else {spec.version: spec}

    def note_placement(self, table: PlacementTable) -> None:
        """Remember the placement (see :attr:`placements`)."""
        self.placements.append(table)

    async def note_placement_async(self, table: PlacementTable) -> None:
        """Remember the placement (see :attr:`placements`)."""
        self.note_placement(table)

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Start every call not started yet."""
        with self._lock:
            for call in calls:
                if call.task_id in self._futures:
                    continue
                self.published[call.task_id] += 1
                self._calls[call.task_id] = call
                if call.task_id in self._revoked:
                    # Cancelled before it was sent: answered, never run (as a worker does).
                    done: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
                    done.set_result(_cancelled(call))
                    self._futures[call.task_id] = done
                else:
                    self._futures[call.task_id] = self._pool.submit(self._run, call)

    async def submit_async(self, call: PreparedCall, on_state: StateCallback | None = None) -> None:
        """Start ``call`` (async flavour of :meth:`submit`)."""
        self.submit([call], on_state)

    def _run(self, call: PreparedCall) -> ToolResult:
        with self._lock:
            if call.task_id in self._revoked:
                return _cancelled(call)
        tool = self._tools.get(call.tool)
        if tool is None:
            return ToolResult.error("unknown_tool", not_served_there_text(call.tool))
        return run_call(tool, call.request(), worker="in-process", limits=Limits())

    def _future(self, call: PreparedCall) -> concurrent.futures.Future[ToolResult]:
        self.submit([call])
        with self._lock:
            return self._futures[call.task_id]

    def wait(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Block until the call ran.

        Raises:
            ResultTimeout: not done within ``timeout`` seconds.
        """
        try:
            return self._future(call).result(_left(call, timeout))
        except concurrent.futures.TimeoutError as exc:
            raise ResultTimeout(f"no result for {call.tool} call {call.call_id}") from exc

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await the call's result.

        Raises:
            ResultTimeout: not done within ``timeout`` seconds.
        """
        try:
            return await asyncio.wait_for(
                asyncio.wrap_future(self._future(call)), _left(call, timeout)
            )
        except TimeoutError as exc:
            raise ResultTimeout(f"no result for {call.tool} call {call.call_id}") from exc

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Forget the calls (a running thread cannot be stopped; its result is dropped).

        A cancelled call that has not started never runs: submitted again (a resumed
        run), it is answered ``cancelled``, as a worker answers it.
        """
        with self._lock:
            for call in calls:
                self.cancelled.append(call.task_id)
                self._revoked.add(call.task_id)
                future = self._futures.pop(call.task_id, None)
                self._calls.pop(call.task_id, None)
                if future is not None:
                    future.cancel()

    async def cancel_async(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Forget the calls (async flavour of :meth:`cancel`)."""
        self.cancel(calls, terminate)

    def in_flight(self) -> int:
        """Calls started and not yet collected or cancelled."""
        with self._lock:
            return sum(1 for future in self._futures.values() if not future.done())

    def data_losses(self) -> int:
        """No Redis in process: nothing to lose."""
        return 0

    def close(self) -> None:
        """Stop the thread pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _left(call: PreparedCall, timeout: float | None) -> float | None:
    """Seconds until the call's deadline or ``timeout``, whichever is first."""
    deadline = deadline_of(call, timeout)
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _cancelled(call: PreparedCall) -> ToolResult:
    return ToolResult.error(
        "cancelled",
        f"Error: the call to '{call.tool}' was cancelled before it started, and was not run.",
        worker="in-process",
    )
