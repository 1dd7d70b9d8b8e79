"""Liveness, readiness and server info: no token needed (load balancers, probes)."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from typing import Any

from fastapi import APIRouter
from redis.exceptions import RedisError

from orchestrator.server.services import Svc, json_response

router = APIRouter(tags=["system"])


@router.get("/ok")
async def ok() -> dict[str, bool]:
    """Liveness: the process answers."""
    return {"ok": True}


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
