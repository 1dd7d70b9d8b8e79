"""The OpenAPI document, true to what the service answers; the 405 that says what is allowed.

FastAPI documents the 200 of each route and a 422 whose ``detail`` is a list; this
service's 422 ``detail`` is one line naming every bad field (what the SDK's error shows),
with the list under ``errors``, and its routes also answer 401, 404, 409, 413, 429, 503.
The response sets here are what the routes declare; :func:`install` rewrites the
validation error's schema and puts the guard's refusals (401, 413, 414, 431; 415 where
there is a body) on every protected operation.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from orchestrator.server.guard import PUBLIC
from orchestrator.server.schemas import JSON_VALUE_MARK, JSON_VALUE_REF, JSON_VALUE_SCHEMA


class ErrorBody(BaseModel):
    """What every refusal answers with."""

    detail: str
    """What was wrong, in one line."""


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: _error("No such thread, run or assistant (or it is another tenant's)")
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: _error("The thread is busy, exists already, or the run has finished")
}
AT_CAPACITY: dict[int | str, dict[str, Any]] = {
    429: _error("This replica, or the tenant's share of it, holds its maximum of runs"),
}
RUN_START = {**NOT_FOUND, **CONFLICT, **AT_CAPACITY}
"""What starting a run may answer besides its result."""

SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"}
}
"""A stream's answer."""

JOIN_STREAM = {
    **SSE,
    **NOT_FOUND,
    **AT_CAPACITY,
    422: {"description": "Last-Event-ID is not an event id"},
}
"""What joining a run's or a thread's stream may answer."""

_GUARD = {
    "401": "Missing or invalid API token",
    "413": "Request body over TOOLFLEET_MAX_BODY_BYTES, or a write past the tenant's "
    "storage quota (TOOLFLEET_TENANT_MAX_BYTES) or cap of crons (TOOLFLEET_TENANT_MAX_CRONS)",
    "414": "URL too long",
    "431": "Headers too large",
    "503": "Redis unavailable or busy past TOOLFLEET_REDIS_POOL_TIMEOUT",
}

_VALIDATION = {
    "title": "HTTPValidationError",
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {"type": "string", "title": "Detail"},
        "errors": {
            "type": "array",
            "title": "Errors",
            "items": {"type": "object"},
        },
    },
}


def install(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document match its answers, and its 405s name every method
    the path allows."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schema["components"]["schemas"]["HTTPValidationError"] = _VALIDATION
            schema = _refer_json_values(schema)
            schema["components"]["schemas"]["JsonValue"] = JSON_VALUE_SCHEMA
            schema["components"]["schemas"].pop("ValidationError", None)
            error_ref = {"$ref": "#/components/schemas/ErrorBody"}
            schema["components"]["schemas"].setdefault("ErrorBody", ErrorBody.model_json_schema())
            for path, operations in schema["paths"].items():
                if path in PUBLIC:
                    continue
                for operation in operations.values():
                    refusals = dict(_GUARD)
                    if "requestBody" in operation:
                        refusals["400"] = "Body not text FastAPI can parse"
                        refusals["415"] = "Body declared neither JSON nor text"
                    for code, text in refusals.items():
                        operation["responses"].setdefault(
                            code,
                            {
                                "description": text,
                                "content": {"application/json": {"schema": error_ref}},
                            },
                        )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
    app.add_exception_handler(HTTPException, _http_error)


def _allowed(document: dict[str, Any], path: str) -> set[str]:
    allowed: set[str] = set()
    for template, operations in document.get("paths", {}).items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            allowed |= {method.upper() for method in operations}
    if "GET" in allowed:
        allowed.add("HEAD")
    return allowed


def _refer_json_values(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get(JSON_VALUE_MARK):
            return {"$ref": JSON_VALUE_REF}
        return {k: _refer_json_values(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_refer_json_values(v) for v in node]
    return node


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 500)
    headers = dict(getattr(exc, "headers", None) or {})
    if status == 405:
        # Starlette names the methods of the first route matching the path only: take
        # them from the document instead, from every path template that matches.
        allowed = _allowed(request.app.openapi(), request.url.path)
        headers["Allow"] = ", ".join(sorted(allowed))
    return JSONResponse(
        {"detail": str(getattr(exc, "detail", ""))}, status_code=status, headers=headers
    )
