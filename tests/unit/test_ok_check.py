"""``/ok?check_db=1`` when a data store fails or hangs: 500 or 503, as LangGraph's
server answers, naming the store that is ``unhealthy``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.exceptions import ConnectionError as RedisConnectionError

from orchestrator.server.routes import system


class _Redis:
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour

    async def ping(self) -> bool:
        if self.behaviour == "down":
            raise RedisConnectionError("connection refused")
        if self.behaviour == "hangs":
            await asyncio.sleep(60)
        return True


class _Checkpointer:
    async def aget_tuple(self, config: Any) -> None:
        return None


async def _ok(behaviour: str, query: str) -> httpx.Response:
    app = FastAPI()
    app.include_router(system.router)
    app.state.services = SimpleNamespace(redis=_Redis(behaviour), checkpointer=_Checkpointer())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get(f"/ok{query}")


def test_redis_down_is_500(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given Redis refusing connections, when /ok is asked to check the data stores, then
    it answers 500 with Redis unhealthy and the checkpointer healthy; unasked, 200."""
    answer = asyncio.run(_ok("down", "?check_db=1"))

    assert answer.status_code == 500
    assert answer.json() == {"ok": False, "services": {"redis": "unhealthy", "database": "healthy"}}
    assert asyncio.run(_ok("down", "")).status_code == 200


def test_redis_hanging_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given Redis not answering in time, when /ok checks it, then 503 (busy, not down)."""
    monkeypatch.setattr(system, "CHECK_SECONDS", 0.2)

    answer = asyncio.run(_ok("hangs", "?check_db=1"))

    assert answer.status_code == 503
    assert answer.json()["services"]["redis"] == "unhealthy"
