"""A2A (Agent2Agent): each assistant as an A2A agent, as LangGraph's server offers it.

Routes (a token needed, as on every other route; the assistant is the caller's tenant's):

- ``GET /.well-known/agent-card.json?assistant_id=<id>``, ``GET /a2a/<id>`` and
  ``GET /a2a/<id>/.well-known/agent-card.json`` (or ``agent.json``): the agent card.
- ``POST /a2a/<id>``: JSON-RPC 2.0. ``message/send`` and ``message/stream`` (SSE) start an
  ordinary run of the assistant on a thread (the A2A ``contextId``; a new thread when
  the message has none), seen in the thread's runs like any other; ``tasks/get`` reads
  the task, ``tasks/cancel`` cancels its running run or ends its wait for input;
  ``agent/getAuthenticatedExtendedCard`` answers the card. The A2A 1.0 names
  (``SendMessage``, ``SendStreamingMessage``, ``GetTask``, ``CancelTask``,
  ``GetExtendedAgentCard``) are accepted too and answered in 1.0's form
  (``TASK_STATE_*``, ``ROLE_*``, ``{"task": ...}``), the slash names in the 0.3 form the
  ``a2a-sdk`` client reads. ``ListTasks`` (1.0 only) lists the assistant's tasks, in
  one context or in the tenant's latest :data:`MAX_CONTEXTS` threads.

A task id is ``<contextId>:<run id>``; a message naming a task continues it (a run on
the same thread). Text parts become one human message each; a data part's object is
merged into the run's input; a file part becomes a content block (a URI is never
fetched). A message to an interrupted task resumes it: ``command`` in the message, a
data part ``{"resume": ...}``, or its text.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError

from orchestrator.server.encoding import dumps, loads, sse_frame
from orchestrator.server.errors import Conflict, NotFound, RequestRefused
from orchestrator.server.eventlog import END, FollowerDropped
from orchestrator.server.guards import runlist
from orchestrator.server.records import RunRecord
from orchestrator.server.routes.assistant_graphs import graph_schemas
from orchestrator.server.routes.thread_edits import update_state
from orchestrator.server.runconfig import thread_config
from orchestrator.server.schemas import (
    ID_MAX_CHARS,
    ItemId,
    NewId,
    RunCreate,
    ThreadStateUpdate,
    decimal,
)
from orchestrator.server.services import Services
from orchestrator.server.tenancy import thread_key

log = logging.getLogger("toolfleet.server")

router = APIRouter(tags=["a2a"])

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
TASK_NOT_FOUND, NOT_CANCELABLE, UNSUPPORTED, CONTENT_NOT_SUPPORTED = -32001, -32002, -32004, -32005

MAX_CONTEXTS = 1000
"""Most threads ``ListTasks`` looks through without a ``contextId`` (the latest)."""

MAX_RUNS = 1000
"""Most runs of one thread read to find its tasks (the latest)."""

MAX_HISTORY = 10
"""Most messages a client may ask a task's history to be cut to (``historyLength``)."""

ALIASES = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}
"""The A2A 0.3 method names (what the a2a-sdk client sends), by their 1.0 names."""
METHODS = {*ALIASES.values(), "ListTasks"}

MODES = ["application/json", "text/plain"]
STATES = {
    "pending": "TASK_STATE_SUBMITTED",
    "running": "TASK_STATE_WORKING",
    "success": "TASK_STATE_COMPLETED",
    "interrupted": "TASK_STATE_CANCELED",  # a cancelled run (a graph's interrupt is a success)
    "error": "TASK_STATE_FAILED",
    "timeout": "TASK_STATE_FAILED",
}
TERMINAL = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}


_THREAD_ID: TypeAdapter[str] = TypeAdapter(NewId)
"""A ``contextId``: a thread id as ``POST /threads`` takes one."""


class RpcError(Exception):
    """A JSON-RPC error answered to the call."""

    def __init__(self, code: int, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        """The HTTP status a card request refused so is answered with."""


# -- the card ----------------------------------------------------------------------------


async def agent_card(svc: Services, tenant: str, assistant_id: str, request: Request) -> Any:
    """The A2A agent card of the tenant's assistant.

    Raises:
        RpcError: no such assistant.
    """
    assistant, schema = await _assistant(svc, tenant, assistant_id)
    inputs, outputs = _modes(assistant)
    properties = schema.get("properties") or {}
    name = assistant.get("name") or assistant["graph_id"]
    description = assistant.get("description") or f"{name} assistant"
    base = str(request.base_url).rstrip("/")
    url = f"{base}/a2a/{assistant['assistant_id']}"
    return {
        "name": name,
        "description": description,
        "url": url,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {
            "streaming": True,
            "pushNotifications": False,
            "stateTransitionHistory": False,
        },
        "defaultInputModes": inputs,
        "defaultOutputModes": outputs,
        "skills": [
            {
                "id": f"{assistant['assistant_id']}-main",
                "name": f"{name} Capabilities",
                "description": description,
                "tags": ["assistant", "langgraph"],
                "examples": [],
                "inputModes": inputs,
                "outputModes": outputs,
                "metadata": {
                    "inputSchema": {
                        "required": schema.get("required") or [],
                        "properties": sorted(properties),
                        "supportsA2A": "messages" in properties,
                    }
                },
            }
        ],
        "version": version("toolfleet"),
    }


def _modes(assistant: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The card's input and output media types: ``metadata.a2a.input_modes`` and
    ``output_modes`` of the assistant where given (non-empty lists of strings).

    Raises:
        RpcError: one of them is given and is not such a list (answered 400).
    """
    metadata = assistant.get("metadata") or {}
    a2a = metadata.get("a2a") if isinstance(metadata, dict) else None
    if a2a is None:
        return list(MODES), list(MODES)
    if not isinstance(a2a, dict):
        raise RpcError(INVALID_PARAMS, "Assistant metadata.a2a must be an object.", 400)
    found = []
    for field in ("input_modes", "output_modes"):
        value = a2a.get(field)
        if value is None:
            found.append(list(MODES))
            continue
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(m, str) and m.strip() for m in value)
        ):
            raise RpcError(
                INVALID_PARAMS,
                f"Assistant metadata.a2a.{field} must be a non-empty array of strings.",
                400,
            )
        found.append([m.strip() for m in value])
    return found[0], found[1]


async def _assistant(
    svc: Services, tenant: str, assistant_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tenant's assistant and its graph's input schema (its state schema if it has
    none, as LangGraph's server reads it; ``{}`` if neither)."""
    try:
        source, assistant = await svc.assistants.resolve(tenant, assistant_id)
    except NotFound:
        raise RpcError(INVALID_PARAMS, f"Assistant '{assistant_id}' not found") from None
    graph = await source.for_run(dict(assistant.get("config") or {}))
    try:  # the input schema alone: the others cost a message's latency for nothing
        schema: dict[str, Any] | None = graph.get_input_jsonschema()
    except Exception:  # a graph's types may have no JSON schema: its state's then
        schema = None
    if not schema:
        schema = graph_schemas(graph).get("state_schema")
    return assistant, schema or {}


def _card_error(exc: RpcError) -> Response:
    # An unknown assistant: 404, as every route of this server answers (LangGraph's
    # server: 400). The body is LangGraph's.
    body = {"error": {"code": exc.code, "message": exc.message}}
    return JSONResponse(body, status_code=exc.status)


_CARD_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "The assistant's metadata.a2a modes are not lists of media types"},
    404: {"description": "No such assistant of the tenant"},
}
_RPC_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The JSON-RPC response (an SSE stream of them for message/stream)",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    202: {"description": "A JSON-RPC response was sent: acknowledged"},
    400: {"description": "The Accept header does not allow the method's answer"},
}


@router.get("/.well-known/agent-card.json", responses=_CARD_RESPONSES)
async def well_known_card(
    request: Request,
    assistant_id: Annotated[str, Query(min_length=1, max_length=ID_MAX_CHARS)],
) -> Response:
    """The agent card of the assistant ``assistant_id`` names (a 422 naming it without
    one; LangGraph's server answers 400)."""
    return await _card(request, assistant_id)


@router.get("/a2a/{assistant_id}/.well-known/agent-card.json", responses=_CARD_RESPONSES)
@router.get("/a2a/{assistant_id}/.well-known/agent.json", include_in_schema=False)
@router.get("/a2a/{assistant_id}", include_in_schema=False)
async def assistant_card(request: Request, assistant_id: ItemId) -> Response:
    """The agent card of the assistant."""
    return await _card(request, assistant_id)


async def _card(request: Request, assistant_id: str) -> Response:
    svc: Services = request.app.state.services
    try:
        return JSONResponse(await agent_card(svc, request.state.tenant, assistant_id, request))
    except RpcError as exc:
        return _card_error(exc)


@router.delete("/a2a/{assistant_id}", include_in_schema=False)
async def no_session(assistant_id: ItemId) -> Response:
    """No session to end (as LangGraph's server: 405)."""
    return Response(status_code=405)


# -- JSON-RPC ------------------------------------------------------------------------------


def _error(code: int, message: str, rpc_id: Any = None) -> Response:
    body = {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}
    return JSONResponse(body)


def _accepts(header: str, media_type: str) -> bool:
    for item in header.split(","):
        kind = item.split(";", 1)[0].strip().lower()
        if kind in ("*/*", media_type) or (
            kind.endswith("/*") and media_type.startswith(kind[:-1])
        ):
            return True
    return False


@router.post("/a2a/{assistant_id}", responses=_RPC_RESPONSES, response_class=JSONResponse)
async def rpc(request: Request, assistant_id: ItemId) -> Response:
    """One A2A JSON-RPC 2.0 call to the assistant (see the module's description)."""
    try:
        message = json.loads(await request.body())
    except (ValueError, RecursionError):  # (nested past the parser's depth)
        return _error(PARSE_ERROR, "Invalid JSON payload")
    if not isinstance(message, dict):
        return _error(INVALID_REQUEST, "Invalid message format: expected object")
    rpc_id = message.get("id")
    if message.get("jsonrpc") != "2.0":
        return _error(
            INVALID_REQUEST,
            "Invalid JSON-RPC message: missing or invalid jsonrpc version",
            rpc_id if _valid_id(rpc_id) else None,
        )
    if not _valid_id(rpc_id):
        return _error(
            INVALID_REQUEST, "Invalid JSON-RPC request: 'id' must be a string, number, or null"
        )
    method = message.get("method")
    legacy = isinstance(method, str) and method in ALIASES
    if legacy:
        method = ALIASES[str(method)]
    if method is not None and not isinstance(method, str):
        return _error(METHOD_NOT_FOUND, "Method not found: method must be a string", rpc_id)
    if method is not None and method not in METHODS:
        return _error(METHOD_NOT_FOUND, f"Method not found: {method}", rpc_id)
    params = message.get("params", {})
    if method in ("SendMessage", "SendStreamingMessage"):
        if not isinstance(params, dict):
            return _error(INVALID_PARAMS, "Invalid params: must be an object", rpc_id)
        if not isinstance(params.get("message"), dict) or not params["message"]:
            return _error(INVALID_PARAMS, "Missing or invalid 'message' in params", rpc_id)
    accept = request.headers.get("accept") or ""
    wanted = "text/event-stream" if method == "SendStreamingMessage" else "application/json"
    if not _accepts(accept, wanted):
        return JSONResponse({"error": f"Accept header must include {wanted}"}, status_code=400)
    if rpc_id is None or method is None:
        if rpc_id is not None and ("result" in message or "error" in message):
            return Response(status_code=202)
        if rpc_id is not None:
            return _error(
                INVALID_REQUEST, "Invalid JSON-RPC request: missing 'method' field", rpc_id
            )
        return _error(
            INVALID_REQUEST, "Invalid message format: must be a JSON-RPC request or notification"
        )
    try:
        assistant_id = str(uuid.UUID(assistant_id))
    except ValueError:
        return _error(INVALID_PARAMS, "Invalid assistant ID: must be a UUID", rpc_id)
    if not isinstance(params, dict):
        params = {}
    call = _Call(request.app.state.services, request.state.tenant, assistant_id, request, legacy)
    if method == "SendStreamingMessage":
        return StreamingResponse(
            call.stream(params, rpc_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    try:
        if method == "SendMessage":
            result: Any = await call.send(params)
        elif method == "GetTask":
            result = await call.get(params)
        elif method == "CancelTask":
            result = await call.cancel(params)
        elif method == "ListTasks":
            result = await call.list(params)
        else:  # GetExtendedAgentCard: the same card (no more for an authenticated caller)
            result = await agent_card(call.svc, call.tenant, assistant_id, request)
    except RpcError as exc:
        return _error(exc.code, exc.message, rpc_id)
    except RequestRefused as exc:
        return _error(INVALID_PARAMS, str(exc), rpc_id)
    except Exception:
        log.exception("A2A %s for assistant %s failed", method, assistant_id)
        return _error(INTERNAL, "Internal server error", rpc_id)
    return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": call.form(result)})


def _valid_id(rpc_id: Any) -> bool:
    return rpc_id is None or (
        isinstance(rpc_id, str | int | float) and not isinstance(rpc_id, bool)
    )


_LEGACY_ROLES = {"ROLE_USER": "user", "ROLE_AGENT": "agent"}
_LEGACY_STATES = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_CANCELED": "canceled",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_REJECTED": "rejected",
    "TASK_STATE_AUTH_REQUIRED": "auth-required",
}


def _legacy(value: Any) -> Any:
    """``value`` in A2A 0.3's spelling: lowercase roles and states."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "role" and isinstance(item, str):
                out[key] = _LEGACY_ROLES.get(item, item)
            elif key == "state" and isinstance(item, str):
                out[key] = _LEGACY_STATES.get(item, item)
            else:
                out[key] = _legacy(item)
        return out
    if isinstance(value, list):
        return [_legacy(v) for v in value]
    return value


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _agent_message(text: str, task_id: str, context_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "kind": "message",
        "role": "ROLE_AGENT",
        "parts": [{"kind": "text", "text": text}],
        "messageId": str(uuid.uuid4()),
        "taskId": task_id,
    }
    if context_id is not None:
        message["contextId"] = context_id
    return message


class _Call:
    """One JSON-RPC call of a tenant to an assistant."""

    def __init__(
        self, svc: Services, tenant: str, assistant_id: str, request: Request, legacy: bool
    ) -> None:
        self.svc = svc
        self.tenant = tenant
        self.assistant_id = assistant_id
        self.request = request
        self.legacy = legacy

    def form(self, result: Any) -> Any:
        """A result in the form the call's method name asks for."""
        if self.legacy:
            return _legacy(result)
        return {"task": result} if result.get("kind") == "task" else result

    # -- message/send, message/stream ----------------------------------------------------

    async def _start(self, params: dict[str, Any]) -> tuple[RunRecord, str, dict[str, Any]]:
        """Check the message, start its run; the run, its task id and the message."""
        configuration = params.get("configuration") or {}
        if not isinstance(configuration, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'configuration' must be an object")
        _history_length(configuration.get("historyLength"))
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
        assistant, schema = await _assistant(self.svc, self.tenant, self.assistant_id)
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
                _THREAD_ID.validate_python(context_id)
            except ValidationError as exc:
                raise RpcError(INVALID_PARAMS, f"contextId: {exc.errors()[0]['msg']}") from None
        if task_id is not None:
            run, state = await self._task(task_id, context_id)
            if state in TERMINAL:
                raise RpcError(UNSUPPORTED, "A terminal task cannot accept another message")
            context_id = run.thread_id
        role = "assistant" if message["role"] in ("agent", "ROLE_AGENT") else "human"
        try:
            body = _input(parts, role, str(message["messageId"]))
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

    async def _interrupted(self, context_id: str) -> bool:
        thread = await self.svc.store.thread(thread_key(self.tenant, context_id))
        return thread is not None and thread.status == "interrupted"

    async def send(self, params: dict[str, Any]) -> dict[str, Any]:
        """``message/send``: run the message, answer the finished task."""
        history_length = _history_length((params.get("configuration") or {}).get("historyLength"))
        run, task_id, _ = await self._start(params)
        run = await self.svc.runs.wait_done(run)
        return await self._finished(run, task_id, history_length)

    async def _finished(
        self, run: RunRecord, task_id: str, history_length: int | None
    ) -> dict[str, Any]:
        values, interrupts = await self._values(run)
        task: dict[str, Any] = {"kind": "task", "id": task_id, "contextId": run.thread_id}
        if history_length != 0:
            task["history"] = _history(values, task_id, run.thread_id, history_length)
        if run.status == "error":
            error = (
                (run.error or {}).get("message") or (run.error or {}).get("error") or "run failed"
            )
            task["status"] = {
                "state": "TASK_STATE_FAILED",
                "message": _agent_message(
                    f"Error executing assistant: {error}", task_id, run.thread_id
                ),
            }
        elif interrupts:
            task["status"] = {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": _now()}
            task["artifacts"] = [_interrupt_artifact(interrupts)]
        else:
            task["status"] = {
                "state": STATES.get(run.status, "TASK_STATE_COMPLETED"),
                "timestamp": _now(),
            }
            task["artifacts"] = [self._artifact(_answer(values))]
        return task

    def _artifact(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "artifactId": str(uuid.uuid4()),
            "name": "Assistant Response",
            "description": f"Response from assistant {self.assistant_id}",
            "parts": parts,
        }

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
                "status": {"state": "TASK_STATE_SUBMITTED", "timestamp": _now()},
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
                        text = _streamed_text(loads(entry.data))
                        if text:
                            update = {
                                "taskId": task_id,
                                "contextId": context_id,
                                "kind": "status-update",
                                "status": {
                                    "state": "TASK_STATE_WORKING",
                                    "message": {**_agent_message(text, task_id, context_id)},
                                    "timestamp": _now(),
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
        status.setdefault("timestamp", _now())
        yield frame(
            {
                "taskId": task_id,
                "contextId": context_id,
                "kind": "status-update",
                "status": status,
                "final": True,
            }
        )

    # -- tasks/get, tasks/cancel -----------------------------------------------------------

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
        task_id, context_id = _task_params(params)
        history_length = _history_length(params.get("historyLength"))
        run, state = await self._task(task_id, context_id)
        task: dict[str, Any] = {
            "kind": "task",
            "id": task_id,
            "contextId": run.thread_id,
            "status": {"state": state, "timestamp": run.updated_at or run.created_at},
        }
        if history_length != 0:
            values = await self._task_values(run)
            task["history"] = _history(values, task_id, run.thread_id, history_length)
        if state == "TASK_STATE_COMPLETED":
            task["status"]["message"] = _agent_message("Task completed successfully", task_id)
        elif state == "TASK_STATE_FAILED":
            task["status"]["message"] = _agent_message(
                f"Task failed with status: {run.status}", task_id
            )
        return task

    async def cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/cancel``: cancel the task's running run."""
        task_id, context_id = _task_params(params)
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
                "timestamp": _now(),
                "message": _agent_message("Task was canceled", task_id),
            },
        }

    async def list(self, params: dict[str, Any]) -> dict[str, Any]:
        """``ListTasks``: the assistant's tasks, the latest first, a page of them."""
        size = params.get("pageSize", 50)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 100:
            raise RpcError(INVALID_PARAMS, "pageSize must be an integer between 1 and 100.")
        history_length = _history_length(params.get("historyLength"))
        wanted = params.get("status")
        if isinstance(wanted, str):  # a 0.3 state name: its 1.0 name
            wanted = {v: k for k, v in _LEGACY_STATES.items()}.get(wanted, wanted)
        if wanted is not None and wanted not in _LEGACY_STATES:
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
                task["history"] = _history(values, task["id"], run.thread_id, history_length)
        following = start + len(page)
        return {
            "tasks": [task for task, _ in page],
            "totalSize": len(listed),
            "pageSize": len(page),
            "nextPageToken": str(following) if following < len(listed) else "",
        }


def _task_params(params: dict[str, Any]) -> tuple[str, str | None]:
    task_id, context_id = params.get("id"), params.get("contextId")
    if not task_id:
        raise RpcError(INVALID_PARAMS, "Missing required parameter: id (task_id)")
    if not isinstance(task_id, str) or (context_id is not None and not isinstance(context_id, str)):
        raise RpcError(INVALID_PARAMS, "Task id and contextId must be strings")
    return task_id, context_id


def _history_length(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RpcError(INVALID_PARAMS, "historyLength must be a non-negative integer")
    if value > MAX_HISTORY:
        raise RpcError(INVALID_PARAMS, f"historyLength cannot exceed {MAX_HISTORY}")
    return value


# -- messages both ways ----------------------------------------------------------------------


def _input(parts: list[Any], role: str, message_id: str) -> dict[str, Any]:
    """A run's input from an A2A message's parts.

    Raises:
        ValueError: a part that is not one of text, file or data (an object).
    """
    messages: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    has_files = any(isinstance(p, dict) and "file" in p for p in parts)
    for part in parts:
        if not isinstance(part, dict):
            raise ValueError("Each message part must be an object with 'text', 'data' or 'file'")
        present = [k for k in ("text", "file", "data") if k in part]
        if len(present) != 1:
            raise ValueError(
                "Each message part must contain exactly one of 'text', 'file' or 'data', "
                f"not {present}"
            )
        if "text" in part:
            if has_files:
                blocks.append({"type": "text", "text": part["text"]})
            else:
                messages.append({"role": role, "content": part["text"], "id": message_id})
        elif "file" in part:
            blocks.append(_file_block(part["file"]))
        else:
            if not isinstance(part["data"], dict):
                raise ValueError("DataPart must contain a JSON object in the 'data' field")
            data.update(part["data"])
    if blocks:
        messages.append({"role": role, "content": blocks, "id": message_id})
    if not messages and not data:
        raise ValueError("Message must contain at least one valid text, data, or file part")
    return {**({"messages": messages} if messages else {}), **data}


def _file_block(file: Any) -> dict[str, Any]:
    """A file part as a content block (a URI passed on, never fetched here)."""
    if not isinstance(file, dict):
        raise ValueError("FilePart must contain a 'file' object with 'bytes' or 'uri'")
    content, uri = file.get("bytes"), file.get("uri")
    if (content is None) == (uri is None):
        raise ValueError("FilePart 'file' must contain exactly one of 'bytes' or 'uri'")
    mime = file.get("mimeType")
    top = mime.split("/", 1)[0].lower() if isinstance(mime, str) else ""
    block: dict[str, Any] = {"type": top if top in ("image", "audio", "video") else "file"}
    block["base64" if content is not None else "url"] = content if content is not None else uri
    if mime:
        block["mime_type"] = mime
    if file.get("name"):
        block["extras"] = {"filename": file["name"]}
    return block


def _role(message: Any) -> str | None:
    """``ROLE_USER``/``ROLE_AGENT`` of a public message; ``None`` for system or tool."""
    if not isinstance(message, dict):
        return None
    kind = str(message.get("type") or "").lower().replace("_", "")
    role = str(message.get("role") or "").lower()
    if kind in ("human", "humanmessage", "humanmessagechunk") or role in ("human", "user"):
        return "ROLE_USER"
    if kind in ("ai", "aimessage", "aimessagechunk") or role in ("ai", "agent", "assistant"):
        return "ROLE_AGENT"
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b if isinstance(b, str) else str(b.get("text") or "")
            for b in content
            if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
        )
    return "" if content is None else str(content)


def _history(
    values: Any, task_id: str, context_id: str, length: int | None
) -> list[dict[str, Any]]:
    """The context's public turns as A2A messages (the last ``length`` of them)."""
    messages = values.get("messages") if isinstance(values, dict) else None
    out = []
    for message in messages or []:
        role = _role(message)
        text = _text(message.get("content")) if role else ""
        if role is None or (role == "ROLE_AGENT" and not text):
            continue
        out.append(
            {
                "kind": "message",
                "role": role,
                "parts": [{"kind": "text", "text": text}],
                "messageId": message.get("id") or str(uuid.uuid4()),
                "taskId": task_id,
                "contextId": context_id,
            }
        )
    return out if length is None else out[-length:] if length else []


def _answer(values: Any) -> list[dict[str, Any]]:
    """The parts of the agent's last answer of this turn (the values as text if none)."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list) or not messages:
        return [{"kind": "text", "text": str(values)}]
    for message in reversed(messages):
        role = _role(message)
        if role == "ROLE_USER":
            break
        if role == "ROLE_AGENT" and (text := _text(message.get("content"))):
            return [{"kind": "text", "text": text}]
    return [{"kind": "text", "text": ""}]


def _streamed_text(data: Any) -> str:
    """The agent's text in one ``messages`` event (its message, or message and metadata)."""
    items = data if isinstance(data, list) else [data]
    return "".join(_text(i.get("content")) for i in items if _role(i) == "ROLE_AGENT")


def _interrupt_artifact(interrupts: list[Any]) -> dict[str, Any]:
    parts = []
    for found in interrupts:
        found = found if isinstance(found, dict) else {"value": found}
        parts.append({"kind": "data", "data": {"id": found.get("id"), "value": found.get("value")}})
    return {
        "artifactId": str(uuid.uuid4()),
        "name": "Interrupt",
        "description": "Agent requires input to continue",
        "parts": parts,
    }
