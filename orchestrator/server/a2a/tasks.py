"""``tasks/get``, ``tasks/cancel`` and ``ListTasks``: the tasks (runs) read, cancelled and
listed; and :class:`Call`, one JSON-RPC call of either kind."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.server.a2a.call import CallBase
from orchestrator.server.a2a.messages import Messages
from orchestrator.server.a2a.parts import agent_message, history, now_iso
from orchestrator.server.a2a.protocol import (
    INVALID_PARAMS,
    LEGACY_STATES,
    MAX_CONTEXTS,
    MAX_RUNS,
    NOT_CANCELABLE,
    STATES,
    TERMINAL,
    RpcError,
    read_history_length,
    task_params,
)
from orchestrator.server.errors import Conflict
from orchestrator.server.guards import runlist
from orchestrator.server.records import RunRecord
from orchestrator.server.routes.thread_edits import update_state
from orchestrator.server.schemas import RunCreate, ThreadStateUpdate, decimal
from orchestrator.server.tenancy import thread_key


class Tasks(CallBase):
    """A call's reads and cancellations of its tasks."""

    async def _end_waiting(self, run: RunRecord, task_id: str) -> None:
        """Cancel a task that waits for input, as LangGraph's server does: a run of the
        task that never starts, cancelled (the task's latest run: ``canceled``), and the
        thread's pending interrupt ended (a checkpoint as node ``__end__``)."""
        marker_body = RunCreate(
            assistant_id=self.assistant_id,
            metadata={"a2a": {"task_id": task_id}},
            after_seconds=3600,  # it is cancelled before it could start
        )
        marker = await self.svc.runs.start_run(self.tenant, run.thread_id, marker_body)
        try:
            await self.svc.runs.cancel(marker, "interrupt")
            await self.svc.runs.wait_done(marker)
            await update_state(
                self.svc,
                self.tenant,
                run.thread_id,
                ThreadStateUpdate(values=None, as_node="__end__"),
            )
        except BaseException:
            marker = await self.svc.runs.refresh(marker)
            if marker.done:
                await self.svc.store.delete_run(marker)
            raise

    async def get(self, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/get``: the task's state and history."""
        task_id, context_id = task_params(params)
        history_length = read_history_length(params.get("historyLength"))
        run, state = await self._task(task_id, context_id)
        task: dict[str, Any] = {
            "kind": "task",
            "id": task_id,
            "contextId": run.thread_id,
            "status": {"state": state, "timestamp": run.updated_at or run.created_at},
        }
        if history_length != 0:
            values = await self._task_values(run)
            task["history"] = history(values, task_id, run.thread_id, history_length)
        if state == "TASK_STATE_COMPLETED":
            task["status"]["message"] = agent_message("Task completed successfully", task_id)
        elif state == "TASK_STATE_FAILED":
            task["status"]["message"] = agent_message(
                f"Task failed with status: {run.status}", task_id
            )
        return task

    async def cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/cancel``: cancel the task's running run."""
        task_id, context_id = task_params(params)
        run, state = await self._task(task_id, context_id)
        if state in TERMINAL:
            raise RpcError(NOT_CANCELABLE, "Task is not cancelable in its current state")
        if state == "TASK_STATE_INPUT_REQUIRED":
            await self._end_waiting(run, task_id)
        else:
            try:
                await self.svc.runs.cancel(run, "interrupt")
            except Conflict:
                raise RpcError(NOT_CANCELABLE, "Task has no active run to cancel") from None
            await self.svc.runs.wait_done(run)
        return {
            "kind": "task",
            "id": task_id,
            "contextId": run.thread_id,
            "status": {
                "state": "TASK_STATE_CANCELED",
                "timestamp": now_iso(),
                "message": agent_message("Task was canceled", task_id),
            },
        }

    async def list(self, params: dict[str, Any]) -> dict[str, Any]:
        """``ListTasks``: the assistant's tasks, the latest first, a page of them."""
        size = params.get("pageSize", 50)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 100:
            raise RpcError(INVALID_PARAMS, "pageSize must be an integer between 1 and 100.")
        history_length = read_history_length(params.get("historyLength"))
        wanted = params.get("status")
        if isinstance(wanted, str):  # a 0.3 state name: its 1.0 name
            wanted = {v: k for k, v in LEGACY_STATES.items()}.get(wanted, wanted)
        if wanted is not None and wanted not in LEGACY_STATES:
            raise RpcError(INVALID_PARAMS, f"Invalid status value: '{wanted}'.")
        after = params.get("statusTimestampAfter")
        if after is not None:
            try:
                datetime.fromisoformat(str(after).replace("Z", "+00:00"))
            except ValueError:
                raise RpcError(
                    INVALID_PARAMS, "statusTimestampAfter must be a valid ISO 8601 timestamp."
                ) from None
            if not isinstance(after, str):
                raise RpcError(INVALID_PARAMS, "statusTimestampAfter must be a string.")
        start = decimal(params.get("pageToken") or "0", MAX_CONTEXTS * MAX_RUNS)
        if start is None:  # not an offset this method gave
            raise RpcError(INVALID_PARAMS, "Invalid pageToken.")
        context_id = params.get("contextId")
        if context_id is not None and not isinstance(context_id, str):
            raise RpcError(INVALID_PARAMS, "contextId must be a string.")
        if context_id is not None:
            found = await self.svc.store.thread(thread_key(self.tenant, context_id))
            threads = [found] if found is not None else []
        else:
            threads = await self.svc.store.search_threads(self.tenant, limit=MAX_CONTEXTS, offset=0)
        tasks: dict[str, tuple[dict[str, Any], RunRecord]] = {}
        for thread in threads:
            runs = [r async for r in runlist.walk(self.svc.store, thread.key, most=MAX_RUNS)]
            for run in runs:  # newest first: a task's first run seen is its latest
                if run.assistant_id != self.assistant_id:
                    continue
                task_id = (run.metadata.get("a2a") or {}).get("task_id") or (
                    f"{thread.thread_id}:{run.run_id}"
                )
                if task_id in tasks:
                    continue
                state = STATES.get(run.status, "TASK_STATE_SUBMITTED")
                if run is runs[0] and run.status == "success" and thread.status == "interrupted":
                    state = "TASK_STATE_INPUT_REQUIRED"
                stamp = run.updated_at or run.created_at
                task = {
                    "kind": "task",
                    "id": task_id,
                    "contextId": thread.thread_id,
                    "status": {"state": state, "timestamp": stamp},
                }
                if not params.get("includeArtifacts"):
                    task["artifacts"] = []
                tasks[task_id] = (task, run)
        listed = [
            (task, run)
            for task, run in tasks.values()
            if (wanted is None or task["status"]["state"] == wanted)
            and (after is None or task["status"]["timestamp"] >= after)
        ]
        listed.sort(key=lambda pair: str(pair[0]["status"]["timestamp"]), reverse=True)
        page = listed[start : start + size]
        if history_length != 0:
            for task, run in page:
                values = await self._task_values(run)
                task["history"] = history(values, task["id"], run.thread_id, history_length)
        following = start + len(page)
        return {
            "tasks": [task for task, _ in page],
            "totalSize": len(listed),
            "pageSize": len(page),
            "nextPageToken": str(following) if following < len(listed) else "",
        }


class Call(Messages, Tasks):
    """One JSON-RPC call of a tenant to an assistant."""
