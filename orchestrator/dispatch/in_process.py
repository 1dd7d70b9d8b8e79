"""An in-process dispatcher: runs tools in threads of this process, no broker.

The one module of the orchestrator that imports the worker's execution code
(:mod:`tool_workers.runtime.execute`, :mod:`tool_workers.runtime.tasks`,
:mod:`tool_workers.runtime.registry`): it *is* a worker, in-process.

For fast tests of agents (and of toolfleet itself). It is a transport under the shared
dispatcher (:mod:`.transport`), so a call is watched, waited for (its deadline, its idle
timeout), read and cancelled by the code that runs with real workers, and its tools are
served as the registry serves a worker's (its registry entry read by
:func:`~orchestrator.dispatch.registry.served_versions`); only sending, revoking and the
states are this module's. A call hands in the states a worker stores (``STARTED``, then
``SUCCESS`` with its result, signed when the settings have a signing key; ``REVOKED``
for a call cancelled before it started), and runs at most once per task id, as with the
Celery dispatcher.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool

from orchestrator.call import PreparedCall
from orchestrator.dispatch.base import PlacementTable
from orchestrator.dispatch.publish import Outcome
from orchestrator.dispatch.registry import served_versions
from orchestrator.dispatch.transport import TransportDispatcher
from orchestrator.dispatch.watch import WatchTable
from orchestrator.messages import not_served_there_text
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import tool_queue
from tool_workers.contract.settings import Settings, ToolPolicies
from tool_workers.contract.signing import sign_result
from tool_workers.runtime.execute import Limits, run_call
from tool_workers.runtime.registry import build_entry
from tool_workers.runtime.tasks import tool_spec

WORKER = "in-process"
"""The worker name the calls run here report."""


class InProcessDispatcher(TransportDispatcher):
    """Runs calls on a thread pool here; counts how often each task id was sent.

    Args:
        tools: The tools to serve.
        policies: Per-tool policy (queues and limits shown in the specs).
        max_workers: Threads running tools concurrently.
        settings: The settings (a signing key signs the results, as a worker does).
    """

    def __init__(
        self,
        tools: Sequence[BaseTool],
        policies: ToolPolicies | None = None,
        max_workers: int = 64,
        settings: Settings | None = None,
    ) -> None:
        settings = settings or Settings()
        self._table = WatchTable()
        super().__init__(
            settings, policies if policies is not None else settings.policies(), self._table
        )
        self._tools = {tool.name: tool for tool in tools}
        # Served as a worker serving these tools is: its registry entry, read by the
        # registry's own code (versions, routing by tool, what only the orchestrator sets).
        specs = [tool_spec(tool, self.policies.for_tool(tool.name)) for tool in tools]
        queues = {spec.queue for spec in specs} | {
            queue for spec in specs if (queue := tool_queue(spec.name, spec.version))
        }
        self._served = served_versions([build_entry(WORKER, queues, specs)], self.policies)
        self._shown = {name: next(iter(v.values())) for name, v in self._served.items()}
        """Each tool's version shown to models (the first served): read on every call."""
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="toolfleet-inprocess"
        )
        self._runs_lock = threading.Lock()
        self._runs: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        """Every call sent here, by task id: its run, whose result is its ready meta."""
        self._revoked: set[str] = set()
        self.published: Counter[str] = Counter()
        """How many times each task id was handed to the pool (always 0 or 1)."""
        self.cancelled: list[str] = []
        """Task ids sent here that a cancellation revoked."""
        self.placements: list[PlacementTable] = []
        """Every tool placement :meth:`note_placement` was given."""

    # -- registry -------------------------------------------------------------------------

    def served_tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Every tool given to the constructor."""
        return self._shown

    async def served_tools_async(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Every tool given to the constructor."""
        return self._shown

    def served_versions(self, name: str) -> Mapping[str, ToolSpec]:
        """The one version of ``name`` given to the constructor (empty: none)."""
        return self._served.get(name, {})

    def note_placement(self, table: PlacementTable) -> None:
        """Remember the placement (see :attr:`placements`)."""
        self.placements.append(table)

    async def note_placement_async(self, table: PlacementTable) -> None:
        """Remember the placement (see :attr:`placements`)."""
        self.note_placement(table)

    # -- the transport --------------------------------------------------------------------

    def _send(self, calls: Sequence[PreparedCall]) -> Mapping[str, Outcome]:
        outcomes: dict[str, Outcome] = {}
        with self._runs_lock:
            for call in calls:
                run = self._runs.get(call.task_id)
                if run is not None:  # sent before: wait for that run (or read its end)
                    outcomes[call.task_id] = Outcome.STORED if run.done() else Outcome.ATTACHED
                    continue
                self.published[call.task_id] += 1
                self._runs[call.task_id] = self._pool.submit(self._run, call)
                outcomes[call.task_id] = Outcome.PUBLISHED
        self._published(outcomes)
        return outcomes

    async def _send_async(self, call: PreparedCall) -> Outcome:
        return self._send([call])[call.task_id]

    def _read_now(self, task_ids: Sequence[str]) -> None:
        for task_id in task_ids:
            with self._runs_lock:
                run = self._runs.get(task_id)
                revoked = task_id in self._revoked
            if run is None or not run.done():
                continue  # a run still going hands its states in when it ends
            meta = _revoked_meta(task_id) if run.cancelled() or revoked else run.result()
            self._table.apply(task_id, meta)

    def _revoke_sent(self, task_ids: Sequence[str], terminate: bool) -> None:
        # A running thread cannot be stopped: its result is dropped (nobody waits).
        with self._runs_lock:
            self.cancelled.extend(task_ids)
            self._revoked.update(task_ids)
            for task_id in task_ids:
                run = self._runs.get(task_id)
                if run is not None:
                    run.cancel()  # not started yet: it never runs

    def _run(self, call: PreparedCall) -> dict[str, Any]:
        with self._runs_lock:
            revoked = call.task_id in self._revoked
        if revoked:
            meta = _revoked_meta(call.task_id)
        else:
            self._table.apply(call.task_id, {"status": "STARTED", "task_id": call.task_id})
            try:
                meta = {"status": "SUCCESS", "task_id": call.task_id, "result": self._answer(call)}
            except Exception as exc:  # stored as a worker's Celery stores a task's failure
                meta = {"status": "FAILURE", "task_id": call.task_id, "result": _failure(exc)}
        self._table.apply(call.task_id, meta)
        return meta

    def _answer(self, call: PreparedCall) -> dict[str, Any]:
        """The call's result in wire form, signed as a worker signs it."""
        tool = self._tools.get(call.tool)
        if tool is None:
            result = ToolResult.error("unknown_tool", not_served_there_text(call.tool))
        else:
            result = run_call(tool, call.request(), worker=WORKER, limits=Limits())
        wire = result.to_wire()
        key = self.settings.signing_key
        return sign_result(key, call.task_id, wire) if key else wire

    def close(self) -> None:
        """Stop waiting, and stop the thread pool (a running tool finishes on its own)."""
        super().close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _failure(exc: Exception) -> dict[str, Any]:
    """A failure record as Celery's result backend writes one."""
    kind = type(exc)
    return {"exc_type": kind.__name__, "exc_message": [str(exc)], "exc_module": kind.__module__}


def _revoked_meta(task_id: str) -> dict[str, Any]:
    """The state a worker stores for a call revoked before it started."""
    return {"status": "REVOKED", "task_id": task_id, "result": None}
