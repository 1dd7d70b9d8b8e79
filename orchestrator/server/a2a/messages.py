"""``message/send`` and ``message/stream``: a message as a run of the assistant, answered
when it ends or streamed as it goes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from orchestrator.server.a2a.call import CallBase
from orchestrator.server.a2a.card import load_assistant
from orchestrator.server.a2a.parts import (
    agent_message,
    answer,
    history,
    interrupt_artifact,
    message_input,
    now_iso,
    streamed_text,
)
from orchestrator.server.a2a.protocol import (
    CONTENT_NOT_SUPPORTED,
    INTERNAL,
    INVALID_PARAMS,
    STATES,
    TERMINAL,
    THREAD_ID,
    UNSUPPORTED,
    RpcError,
    read_history_length,
)
from orchestrator.server.encoding import dumps, loads, sse_frame
from orchestrator.server.errors import RequestRefused
from orchestrator.server.eventlog import END, FollowerDropped
from orchestrator.server.records import RunRecord
from orchestrator.server.runconfig import thread_config
from orchestrator.server.schemas import RunCreate

log = logging.getLogger("toolfleet.server")


class Messages(CallBase):
    """A call's messages: each one a run of the assistant on the context's thread."""

    async def _start(self, params: dict[str, Any]) -> tuple[RunRecord, str, dict[str, Any]]:
        """Check the message, start its run; the run, its task id and the message."""
        configuration = params.get("configuration") or {}
        if not isinstance(configuration, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'configuration' must be an object")
        read_history_length(configuration.get("historyLength"))
        message = params["message"]
        if not message.get("messageId"):
            raise RpcError(INVALID_PARAMS, "Missing required 'messageId' in message")
        if not message.get("role"):
            raise RpcError(INVALID_PARAMS, "Missing required 'role' in message")
        parts = message.get("parts", [])
        if not isinstance(parts, list):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'parts' must be an array")
        if not parts:
            raise RpcError(INVALID_PARAMS, "Message must contain at least one part")
        assistant, schema = await load_assistant(self.svc, self.tenant, self.assistant_id)
        conversational = any(isinstance(p, dict) and ("text" in p or "file" in p) for p in parts)
        if conversational and "messages" not in (schema.get("properties") or {}):
            raise RpcError(
                INVALID_PARAMS,
                f"Assistant '{self.assistant_id}' (graph '{assistant['graph_id']}') does "
                "not support A2A conversational messages: its input has no 'messages'",
            )
        context_id, task_id = message.get("contextId"), message.get("taskId")
        if context_id is not None and not isinstance(context_id, str):
            raise RpcError(INVALID_PARAMS, "contextId must be a string")
        if task_id is not None and not isinstance(task_id, str):
            raise RpcError(INVALID_PARAMS, "taskId must be a string")
        if context_id is not None:
            try:  # it names a thread, maybe a new one: a thread id as the routes take
                THREAD_ID.validate_python(context_id)
            except ValidationError as exc:
                raise RpcError(INVALID_PARAMS, f"contextId: {exc.errors()[0]['msg']}") from None
        if task_id is not None:
            run, state = await self._task(task_id, context_id)
            if state in TERMINAL:
                raise RpcError(UNSUPPORTED, "A terminal task cannot accept another message")
            context_id = run.thread_id
        role = "assistant" if message["role"] in ("agent", "ROLE_AGENT") else "human"
        try:
            body = message_input(parts, role, str(message["messageId"]))
        except ValueError as exc:
            raise RpcError(CONTENT_NOT_SUPPORTED, str(exc)) from None
        command = await self._command(message, parts, context_id, task_id, body)
        metadata = {"a2a": {"task_id": task_id}} if task_id else {}
        run_body: dict[str, Any] = {
            "assistant_id": self.assistant_id,
            "metadata": metadata,
            "if_not_exists": "create",
            "stream_mode": ["messages", "values"],
        }
        if command is not None:
            run_body["command"] = command
            if body:
                run_body["input"] = body
        else:
            run_body["input"] = body
        if isinstance(params.get("context"), dict):
            run_body["context"] = params["context"]
        try:
            create = RunCreate.model_validate(run_body)
        except ValidationError as exc:
            raise RpcError(INVALID_PARAMS, f"Invalid request: {exc.errors()[0]['msg']}") from None
        if create.input is not None and create.command is not None:
            create.input = None  # a resume carries the answer; the text is not new input
        run = await self.svc.runs.start_run(self.tenant, context_id or str(uuid.uuid4()), create)
        return run, task_id or f"{run.thread_id}:{run.run_id}", message

    async def _command(
        self,
        message: dict[str, Any],
        parts: list[Any],
        context_id: str | None,
        task_id: str | None,
        body: dict[str, Any],
    ) -> dict[str, Any] | None:
        """The resume command of a message to an interrupted task, or ``None``."""
        command = message.get("command")
        if command is not None:
            if not isinstance(command, dict):
                raise RpcError(INVALID_PARAMS, "command must be an object")
            if command.get("resume") is not None and not task_id:
                raise RpcError(INVALID_PARAMS, "taskId is required when resuming a task")
            return command
        resumes = [
            p["data"]["resume"]
            for p in parts
            if isinstance(p, dict) and isinstance(p.get("data"), dict) and "resume" in p["data"]
        ]
        if len(resumes) > 1:
            raise RpcError(INVALID_PARAMS, "Only one resume value is allowed in data parts")
        interrupted = bool(context_id and task_id) and await self._interrupted(str(context_id))
        if resumes:
            if not (context_id and task_id):
                raise RpcError(
                    INVALID_PARAMS, "contextId and taskId are required when resuming a task"
                )
            if not interrupted:
                raise RpcError(INVALID_PARAMS, "Task is not awaiting input")
            body.pop("resume", None)
            return {"resume": resumes[0]}
        texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts and interrupted:
            body.pop("messages", None)
            return {"resume": "\n".join(texts)}
        return None

    async def send(self, params: dict[str, Any]) -> dict[str, Any]:
        """``message/send``: run the message, answer the finished task."""
        history_length = read_history_length(
            (params.get("configuration") or {}).get("historyLength")
        )
        run, task_id, _ = await self._start(params)
        run = await self.svc.runs.wait_done(run)
        return await self._finished(run, task_id, history_length)

    async def _finished(
        self, run: RunRecord, task_id: str, history_length: int | None
    ) -> dict[str, Any]:
        values, interrupts = await self._values(run)
        task: dict[str, Any] = {"kind": "task", "id": task_id, "contextId": run.thread_id}
        if history_length != 0:
            task["history"] = history(values, task_id, run.thread_id, history_length)
        if run.status == "error":
            error = (
                (run.error or {}).get("message") or (run.error or {}).get("error") or "run failed"
            )
            task["status"] = {
                "state": "TASK_STATE_FAILED",
                "message": agent_message(
                    f"Error executing assistant: {error}", task_id, run.thread_id
                ),
            }
        elif interrupts:
            task["status"] = {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": now_iso()}
            task["artifacts"] = [interrupt_artifact(interrupts)]
        else:
            task["status"] = {
                "state": STATES.get(run.status, "TASK_STATE_COMPLETED"),
                "timestamp": now_iso(),
            }
            task["artifacts"] = [self._artifact(answer(values))]
        return task

    def _artifact(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "artifactId": str(uuid.uuid4()),
            "name": "Assistant Response",
            "description": f"Response from assistant {self.assistant_id}",
            "parts": parts,
        }

    async def _values(self, run: RunRecord) -> tuple[Any, list[Any]]:
        """The thread's values as JSON, and its pending interrupts."""
        thread = await self.svc.store.thread(run.thread_key)
        if thread is None:
            return {}, []
        graph = await self.svc.graphs.for_thread(run.thread_key, thread.metadata)
        snapshot = await graph.aget_state(thread_config(run.thread_key))
        interrupts = (
            loads(dumps(list(snapshot.interrupts))) if thread.status == "interrupted" else []
        )
        return loads(dumps(snapshot.values)), interrupts

    async def stream(self, params: dict[str, Any], rpc_id: Any) -> AsyncIterator[bytes]:
        """``message/stream``: the task, its progress and its end, as SSE."""

        def frame(result: Any) -> bytes:
            return sse_frame(
                "message", dumps({"jsonrpc": "2.0", "id": rpc_id, "result": self.form(result)})
            )

        try:
            run, task_id, message = await self._start(params)
        except (RpcError, RequestRefused) as exc:
            code, text = (
                (exc.code, exc.message) if isinstance(exc, RpcError) else (INVALID_PARAMS, str(exc))
            )
            yield sse_frame(
                "message",
                dumps({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": text}}),
            )
            return
        context_id = run.thread_id
        yield frame(
            {
                "kind": "task",
                "id": task_id,
                "contextId": context_id,
                "history": [
                    {"kind": "message", **message, "taskId": task_id, "contextId": context_id}
                ],
                "status": {"state": "TASK_STATE_SUBMITTED", "timestamp": now_iso()},
            }
        )
        try:
            async with self.svc.runs.relay.follow(run.run_id) as follower:
                while True:
                    try:
                        entry = await follower.next(timeout=15.0)
                    except FollowerDropped:
                        break  # the run goes on: its end is awaited below
                    if entry is None:
                        await self.svc.runs.get_run(run.tenant, run.thread_id, run.run_id)
                        continue
                    if entry.event == END:
                        break
                    if entry.event.startswith("messages"):
                        text = streamed_text(loads(entry.data))
                        if text:
                            update = {
                                "taskId": task_id,
                                "contextId": context_id,
                                "kind": "status-update",
                                "status": {
                                    "state": "TASK_STATE_WORKING",
                                    "message": {**agent_message(text, task_id, context_id)},
                                    "timestamp": now_iso(),
                                },
                                "final": False,
                            }
                            yield frame(update)
            run = await self.svc.runs.wait_done(run)
            done = await self._finished(run, task_id, None)
        except Exception:
            log.exception("A2A message/stream for assistant %s failed", self.assistant_id)
            yield sse_frame(
                "message",
                dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": rpc_id,
                        "error": {"code": INTERNAL, "message": "Internal server error"},
                    }
                ),
            )
            return
        state = done["status"]["state"]
        for artifact in done.get("artifacts") or []:
            yield frame(
                {
                    "taskId": task_id,
                    "contextId": context_id,
                    "kind": "artifact-update",
                    "artifact": artifact,
                    **(
                        {"append": False, "lastChunk": True}
                        if state != "TASK_STATE_INPUT_REQUIRED"
                        else {}
                    ),
                }
            )
        status = dict(done["status"])
        status.setdefault("timestamp", now_iso())
        yield frame(
            {
                "taskId": task_id,
                "contextId": context_id,
                "kind": "status-update",
                "status": status,
                "final": True,
            }
        )
