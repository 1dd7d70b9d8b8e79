"""What one A2A JSON-RPC call of a tenant to an assistant knows, and the reads both
its kinds share: the task a task id names, the values a run left."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from orchestrator.server.a2a.protocol import MAX_RUNS, STATES, TASK_NOT_FOUND, RpcError, as_legacy
from orchestrator.server.encoding import dumps, loads
from orchestrator.server.errors import NotFound
from orchestrator.server.guards import runlist
from orchestrator.server.records import RunRecord
from orchestrator.server.runconfig import thread_config
from orchestrator.server.services import Services
from orchestrator.server.tenancy import thread_key


@dataclass(eq=False)
class CallBase:
    """One JSON-RPC call of a tenant to an assistant: who asks, of which assistant, in
    which dialect."""

    svc: Services
    tenant: str
    assistant_id: str
    request: Request
    legacy: bool

    def form(self, result: Any) -> Any:
        """A result in the form the call's method name asks for."""
        if self.legacy:
            return as_legacy(result)
        return {"task": result} if result.get("kind") == "task" else result

    async def _interrupted(self, context_id: str) -> bool:
        thread = await self.svc.store.thread(thread_key(self.tenant, context_id))
        return thread is not None and thread.status == "interrupted"

    async def _task(self, task_id: str, context_id: str | None) -> tuple[RunRecord, str]:
        """The latest run of the task and the task's A2A state.

        Raises:
            RpcError: no such task of this assistant (``TASK_NOT_FOUND``).
        """
        parsed, _, anchor = task_id.partition(":")
        if not anchor:
            parsed, anchor = "", task_id
        if parsed and context_id and parsed != context_id:
            raise RpcError(TASK_NOT_FOUND, f"Task not found: {task_id}")
        context = context_id or parsed
        if not context:
            raise RpcError(TASK_NOT_FOUND, f"Task not found: {task_id}")
        try:
            run = await self.svc.runs.get_run(self.tenant, context, anchor)
        except NotFound:
            raise RpcError(TASK_NOT_FOUND, f"Task not found: {task_id}") from None
        if run.assistant_id != self.assistant_id:
            raise RpcError(TASK_NOT_FOUND, f"Task not found: {task_id}")
        # Newest first, read by page until the task's latest run: no later run of the
        # task is older than the one its id names.
        newest: RunRecord | None = None
        async for later in runlist.walk(self.svc.store, run.thread_key, most=MAX_RUNS):
            newest = newest or later
            if (
                later.run_id == run.run_id
                or (later.metadata.get("a2a") or {}).get("task_id") == task_id
            ):
                run = later
                break
        state = STATES.get(run.status, "TASK_STATE_SUBMITTED")
        if (
            run.status == "success"
            and newest is not None
            and newest.run_id == run.run_id
            and await self._interrupted(context)
        ):
            state = "TASK_STATE_INPUT_REQUIRED"
        return run, state

    async def _task_values(self, run: RunRecord) -> Any:
        """The thread's values as the run left them (its last checkpoint), as JSON; the
        latest values if no checkpoint names the run."""
        thread = await self.svc.store.thread(run.thread_key)
        if thread is None:
            return {}
        graph = await self.svc.graphs.for_thread(run.thread_key, thread.metadata)
        config = thread_config(run.thread_key)
        async for snapshot in graph.aget_state_history(
            config, filter={"run_id": run.run_id}, limit=1
        ):
            return loads(dumps(snapshot.values))
        return loads(dumps((await graph.aget_state(config)).values))
