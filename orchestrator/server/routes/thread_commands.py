"""The thread-centric protocol, as langgraph-sdk's ``client.threads.stream`` speaks it.

- ``POST /threads/{thread_id}/commands``: one command, ``{"id": <int>, "method": <str>,
  "params": {...}}``, answered ``{"type": "success", "id", "result", "meta"}`` or, for a
  command refused, ``{"type": "error", "id", "error": <code>, "message"}`` (both 200; a
  body that is not a command is a 400). ``run.start`` starts a run on the thread (made
  if it does not exist), ``input.respond`` answers the thread's pending interrupts (one,
  or several at once with ``responses``) by a run resuming it. Both start the run
  through the runner as every other route does: the same record, queue, multitask
  strategy and event log.
- ``POST /threads/{thread_id}/stream/events``: the thread's runs as protocol events
  (:mod:`orchestrator.server.threadevents`), filtered by the body's ``channels``,
  ``namespaces`` and ``depth``; ``since`` resumes after that ``seq``. The stream stays
  open for the thread's later runs until the client leaves.

The commands a client sends over a WebSocket (``subscription.*``, ``agent.getTree``) have
no meaning over HTTP (the stream's filter is its body; the graph is ``GET
/assistants/{id}/graph``): they are answered with the error ``unsupported``, as is a
``langsmith_tracer`` (this server traces as its deployment is configured, not per run).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from orchestrator.server.encoding import SSE_HEARTBEAT, dumps, loads, sse_frame
from orchestrator.server.errors import AtCapacity, RequestRefused
from orchestrator.server.openapi import AT_CAPACITY, NOT_FOUND
from orchestrator.server.routes.thread_stream import REPLAY_WINDOW, newest_runs, thread_runs
from orchestrator.server.routes.threads import existing_thread
from orchestrator.server.runconfig import thread_config
from orchestrator.server.runstream import ProtocolRun
from orchestrator.server.schemas import NewThreadId, ThreadId
from orchestrator.server.services import Services, Svc, Tenant
from orchestrator.server.streaming import HeldStreamingResponse
from orchestrator.server.streamquota import Streams
from orchestrator.server.threadevents import (
    CHANNEL_PATTERN,
    MAX_CHANNELS,
    MAX_DEPTH,
    MAX_NAMESPACES,
    MAX_SEGMENT_CHARS,
    MAX_SEGMENTS,
    MAX_SEQ,
    Filter,
    parse_filter,
    replayed,
    run_events,
)

router = APIRouter(prefix="/threads", tags=["threads"])

RUN_MODES = ["values", "updates", "messages-tuple", "custom", "tasks", "checkpoints"]
"""The stream modes a command's run is recorded with (what joining it streams)."""

RUN_START_PARAMS = frozenset(
    {"assistant_id", "input", "config", "metadata", "langsmith_tracer"}
    # The JavaScript client sends the strategy under both names.
    | {"multitaskStrategy", "multitask_strategy"}
)
RESPOND_PARAMS = frozenset(
    {"interrupt_id", "namespace", "response", "responses", "update", "goto", "config", "metadata"}
    # The JavaScript client's strictResume: an answer to an interrupt not pending is
    # always refused here (no_such_interrupt), strict or not.
    | {"strict_resume"}
)
MAX_RESPONSES = 1_000


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI extra of a route whose required body is JSON of ``schema``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_COMMAND_BODY = _json_body(
    {
        "type": "object",
        "required": ["id", "method"],
        "properties": {
            # The ids a JSON parser reads as integers (64 bits).
            "id": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
            "method": {"type": "string", "enum": ["run.start", "input.respond"]},
            "params": {"type": "object"},
        },
    }
)
_EVENTS_BODY = _json_body(
    {
        "type": "object",
        "required": ["channels"],
        "additionalProperties": False,
        "properties": {
            "channels": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CHANNELS,
                "items": {
                    "type": "string",
                    "maxLength": MAX_SEGMENT_CHARS,
                    "pattern": CHANNEL_PATTERN,
                },
            },
            "namespaces": {
                "type": "array",
                "maxItems": MAX_NAMESPACES,
                "items": {
                    "type": "array",
                    "maxItems": MAX_SEGMENTS,
                    "items": {"type": "string", "maxLength": MAX_SEGMENT_CHARS},
                },
            },
            "depth": {"type": "integer", "minimum": 0, "maximum": MAX_DEPTH},
            "since": {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
        },
    }
)


class CommandError(Exception):
    """A command refused: its protocol error code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@router.post(
    "/{thread_id}/commands",
    openapi_extra=_COMMAND_BODY,
    responses={400: {"description": "The body is not a command"}, **AT_CAPACITY},
)
async def thread_command(
    svc: Svc, tenant: Tenant, thread_id: NewThreadId, request: Request
) -> Response:
    """Run one protocol command on the thread (``run.start``, ``input.respond``)."""
    try:
        command = loads(await request.body())
    except ValueError:
        return JSONResponse({"detail": "Invalid JSON body"}, status_code=400)
    if (
        not isinstance(command, dict)
        or not isinstance(command.get("id"), int)
        or isinstance(command.get("id"), bool)
        or not isinstance(command.get("method"), str)
    ):
        return JSONResponse(
            _error(
                command.get("id") if isinstance(command, dict) else None,
                "invalid_argument",
                "Protocol commands must include an integer id and string method.",
            ),
            status_code=400,
        )
    cmd_id: int = command["id"]
    params = command.get("params", {})
    try:
        if not isinstance(params, dict):
            raise CommandError("invalid_argument", "params must be an object")
        if command["method"] == "run.start":
            result = await _run_start(svc, tenant, thread_id, params)
        elif command["method"] == "input.respond":
            result = await _input_respond(svc, tenant, thread_id, params)
        elif command["method"] in (
            "subscription.subscribe",
            "subscription.unsubscribe",
            "subscription.reconnect",
            "agent.getTree",
        ):
            raise CommandError(
                "unsupported",
                f"{command['method']} is a command of the WebSocket transport; over HTTP a "
                "stream's filter is the body of POST /threads/{thread_id}/stream/events",
            )
        else:
            raise CommandError(
                "unknown_command", f"Unknown protocol command: {command['method'][:100]}"
            )
    except CommandError as refused:
        return Response(dumps(_error(cmd_id, refused.code, refused.message)), media_type=_JSON)
    answer = {
        "type": "success",
        "id": cmd_id,
        "result": result,
        # A command's answer is not on any stream: no event is applied through it.
        "meta": {"applied_through_seq": 0},
    }
    return Response(dumps(answer), media_type=_JSON)


_JSON = "application/json"


def _error(cmd_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "id": cmd_id, "error": code, "message": message}


def _only(params: dict[str, Any], allowed: frozenset[str], method: str) -> None:
    unknown = sorted(str(k)[:60] for k in params.keys() - allowed)
    if unknown:
        raise CommandError("invalid_argument", f"{method} does not take {', '.join(unknown[:10])}")


async def _start(svc: Services, tenant: str, thread_id: str, fields: dict[str, Any]) -> str:
    """Start a run of the command through the runner; its run id."""
    fields = {k: v for k, v in fields.items() if v is not None}
    fields.update(
        stream_mode=RUN_MODES,
        stream_subgraphs=True,
        stream_resumable=True,
        if_not_exists="create",
    )
    try:
        body = ProtocolRun.model_validate(fields)
        run = await svc.runs.start_run(tenant, thread_id, body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'params'}: {e['msg']}"
            for e in exc.errors()[:5]
        )
        raise CommandError("invalid_argument", problems) from None
    except AtCapacity:
        raise  # a 429: the client retries the command later
    except RequestRefused as exc:
        code = "invalid_argument" if exc.status_code == 422 else "unknown_error"
        raise CommandError(code, str(exc)) from None
    return run.run_id


async def _run_start(
    svc: Services, tenant: str, thread_id: str, params: dict[str, Any]
) -> dict[str, Any]:
    _only(params, RUN_START_PARAMS, "run.start")
    assistant_id = params.get("assistant_id")
    if not isinstance(assistant_id, str) or not assistant_id:
        raise CommandError("invalid_argument", "run.start requires an assistant_id.")
    if params.get("langsmith_tracer") is not None:
        raise CommandError(
            "unsupported",
            "langsmith_tracer: this server traces runs as its deployment is configured",
        )
    config = params.get("config")
    fields: dict[str, Any] = {
        "assistant_id": assistant_id,
        "input": params.get("input"),
        "config": config,
        "metadata": params.get("metadata"),
        "multitask_strategy": (
            params.get("multitaskStrategy") or params.get("multitask_strategy") or "enqueue"
        ),
    }
    # A fork: the checkpoint to run from, as LangGraph's server reads it from the config.
    configurable = config.get("configurable") if isinstance(config, dict) else None
    if isinstance(configurable, dict) and configurable.get("checkpoint_id") is not None:
        fields["checkpoint_id"] = configurable["checkpoint_id"]
    return {"run_id": await _start(svc, tenant, thread_id, fields)}


async def _input_respond(
    svc: Services, tenant: str, thread_id: str, params: dict[str, Any]
) -> dict[str, Any]:
    _only(params, RESPOND_PARAMS, "input.respond")
    if not isinstance(params.get("strict_resume", False), bool):
        raise CommandError("invalid_argument", "strict_resume must be a boolean")
    answers = _answers(params)
    try:
        record = await existing_thread(svc, tenant, thread_id)
    except RequestRefused:
        raise CommandError("no_such_run", "No interrupted run is bound to this thread.") from None
    assistant_id = record.metadata.get("assistant_id")
    if not isinstance(assistant_id, str):
        raise CommandError("no_such_run", "No interrupted run is bound to this thread.")
    graph = await svc.graphs.for_thread(record.key, record.metadata)
    snapshot = await graph.aget_state(thread_config(record.key), subgraphs=True)
    pending = _pending_ids(snapshot)
    for interrupt_id in answers:
        if interrupt_id not in pending:
            raise CommandError(
                "no_such_interrupt",
                f"Unknown or already-consumed interrupt: {interrupt_id[:100]}",
            )
    command: dict[str, Any] = {"resume": answers}
    for name in ("update", "goto"):
        if params.get(name) is not None:
            command[name] = params[name]
    fields = {
        "assistant_id": assistant_id,
        "command": command,
        "config": params.get("config"),
        "metadata": params.get("metadata"),
    }
    await _start(svc, tenant, thread_id, fields)
    return {}


def _answers(params: dict[str, Any]) -> dict[str, Any]:
    """``{interrupt_id: response}`` of an ``input.respond``'s one or many answers."""
    many = params.get("responses")
    if many is not None:
        if not isinstance(many, list) or not many or len(many) > MAX_RESPONSES:
            raise CommandError(
                "invalid_argument",
                f"input.respond responses must be a non-empty array (at most {MAX_RESPONSES})",
            )
        entries = many
    else:
        entries = [params]
    answers: dict[str, Any] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("interrupt_id"), str):
            raise CommandError("invalid_argument", "input.respond requires an interrupt_id.")
        namespace = entry.get("namespace", [])
        if not isinstance(namespace, list) or not all(isinstance(s, str) for s in namespace):
            raise CommandError(
                "invalid_argument", "input.respond requires namespace to be a list of strings."
            )
        answers[entry["interrupt_id"]] = entry.get("response")
    return answers


def _pending_ids(snapshot: Any) -> set[str]:
    """The ids of the interrupts waiting in the thread's state (subgraphs' too)."""
    found = {i.id for i in getattr(snapshot, "interrupts", ()) or ()}
    for task in getattr(snapshot, "tasks", ()) or ():
        found.update(i.id for i in task.interrupts or ())
        if task.state is not None and not isinstance(task.state, dict):
            found |= _pending_ids(task.state)
    return found


# -- the event stream -----------------------------------------------------------------------


@router.post(
    "/{thread_id}/stream/events",
    openapi_extra=_EVENTS_BODY,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
        400: {"description": "No channels, or one this server does not stream"},
        **NOT_FOUND,
        **AT_CAPACITY,
    },
    response_class=StreamingResponse,
)
async def thread_events(
    svc: Svc, tenant: Tenant, streams: Streams, thread_id: ThreadId, request: Request
) -> Response:
    """The thread's runs as protocol events, from its first (after ``since``), then its
    later ones as they come."""
    try:
        body = loads(await request.body())
    except ValueError:
        return JSONResponse({"detail": "Invalid JSON body"}, status_code=400)
    try:
        wanted, since = parse_filter(body)
    except ValueError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    record = await existing_thread(svc, tenant, thread_id)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return HeldStreamingResponse(
        _frames(svc, record.key, wanted, since or 0),
        release=streams.take(tenant),  # last: nothing after it may fail
        media_type="text/event-stream",
        headers=headers,
    )


async def _frames(svc: Services, thread: str, wanted: Filter, since: int) -> AsyncIterator[bytes]:
    seq = 0
    recent = await newest_runs(svc, thread, REPLAY_WINDOW)
    seen = {r.run_id for r in recent}
    due = list(reversed(recent))  # every run of the thread, oldest first
    hidden = {r.run_id for r in recent if not replayed(r)}
    async for run in thread_runs(svc, thread, seen, due):
        if run is None:
            yield SSE_HEARTBEAT
            continue
        graph_name = str(run.metadata.get("graph_id") or run.assistant_id)
        async for event in run_events(svc, run, graph_name):
            if event is None:
                yield SSE_HEARTBEAT
                continue
            seq += 1  # a hidden run's events are numbered too: seq is the same everywhere
            if seq <= since or run.run_id in hidden or not wanted.matches(event):
                continue
            event["seq"] = seq
            yield sse_frame(event["method"], dumps(event), str(seq))
