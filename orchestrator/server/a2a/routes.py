"""The A2A routes: the agent card and the JSON-RPC endpoint, which checks a call and
hands it to :class:`~orchestrator.server.a2a.tasks.Call`."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchestrator.server.a2a.card import agent_card
from orchestrator.server.a2a.protocol import (
    ALIASES,
    INTERNAL,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    METHODS,
    PARSE_ERROR,
    RpcError,
    valid_id,
)
from orchestrator.server.a2a.tasks import Call
from orchestrator.server.errors import RequestRefused
from orchestrator.server.schemas import ID_MAX_CHARS, ItemId
from orchestrator.server.services import Services

log = logging.getLogger("toolfleet.server")

router = APIRouter(tags=["a2a"])


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
            rpc_id if valid_id(rpc_id) else None,
        )
    if not valid_id(rpc_id):
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
    call = Call(request.app.state.services, request.state.tenant, assistant_id, request, legacy)
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
