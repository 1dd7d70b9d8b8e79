"""Liveness, readiness and server info: no token needed (load balancers, probes)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from importlib.metadata import version
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from redis.exceptions import RedisError

from orchestrator.server.services import Services, Svc, json_response

log = logging.getLogger("toolfleet.server")

router = APIRouter(tags=["system"])

CHECK_SECONDS = 5.0
"""How long ``/ok?check_db=1`` waits for each data store."""

OVERLOADED = (TimeoutError,)
"""Check failures that mean busy rather than down: ``/ok`` answers 503, not 500."""


DATA_STORES = ("redis", "database")
"""What ``/ok?check_db=1`` checks: Redis and the checkpointer."""


def _data_checks(svc: Services) -> list[Awaitable[Any]]:
    """A cheap read of each of :data:`DATA_STORES`, in that order."""
    probe: Any = {"configurable": {"thread_id": "/ok", "checkpoint_ns": ""}}
    return [svc.redis.ping(), svc.checkpointer.aget_tuple(probe)]


@router.get(
    "/ok",
    responses={
        500: {"description": "check_db=1 and a data store failed"},
        503: {"description": "check_db=1 and a data store did not answer in time"},
    },
)
async def ok(
    request: Request,
    check_db: Annotated[int, Query(ge=0, le=1, description="1: check the data stores")] = 0,
) -> Any:
    """Liveness: the process answers; with ``check_db=1``, its data stores answer too
    (each one ``healthy`` or ``unhealthy``; 500 when one fails, 503 when one is too busy
    to answer in time, as LangGraph's server answers)."""
    if not check_db:  # (no service touched: it answers as soon as the process does)
        return {"ok": True, "services": dict.fromkeys(DATA_STORES, "skipped")}
    svc: Services = request.app.state.services
    results = await asyncio.gather(
        *(asyncio.wait_for(check, CHECK_SECONDS) for check in _data_checks(svc)),
        return_exceptions=True,
    )
    services: dict[str, str] = {}
    for name, result in zip(DATA_STORES, results, strict=True):
        services[name] = "unhealthy" if isinstance(result, BaseException) else "healthy"
        if isinstance(result, BaseException):
            log.warning("/ok: %s check failed: %r", name, result)
    failed = any(isinstance(r, BaseException) for r in results)
    busy = any(isinstance(r, OVERLOADED) for r in results)
    status = 503 if busy else 500 if failed else 200
    return json_response({"ok": not failed, "services": services}, status)


@router.get("/ready", responses={503: {"description": "Redis down or no worker registered"}})
async def ready(svc: Svc) -> Any:
    """Readiness: Redis answers and at least one tool worker is in the registry."""
    checks: dict[str, Any] = {"redis": False, "workers": 0, "tools": 0}
    try:
        checks["redis"] = bool(await svc.redis.ping())
        registry = svc.dispatcher.registry()
        await asyncio.to_thread(registry.refresh)
        checks["workers"] = len(registry.workers())
        checks["tools"] = len(registry.tools())
    except (RedisError, OSError) as exc:
        checks["error"] = type(exc).__name__
    checks["ready"] = bool(checks["redis"] and checks["workers"])
    checks["runs"] = svc.runs.active
    return json_response(checks, 200 if checks["ready"] else 503)


@router.get("/info")
async def info() -> dict[str, Any]:
    """Server version and the protocol features it implements."""
    return {
        "version": version("toolfleet"),
        "flags": {"assistants": True, "crons": True, "store": False, "langsmith": False},
    }
