"""Helpers of the fault-injection suite: real workers, real Redis, injected failures."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from tool_workers.settings import Settings

FAULT_POLICY = Path(__file__).with_name("fault_policy.toml")


@pytest.fixture
def fault_settings(make_settings: Callable[..., Settings]) -> Callable[..., Settings]:
    """Settings with the fault policy: redelivery after ~11 s instead of minutes."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"config": FAULT_POLICY, "redelivery_margin": 2.0}
        values.update(overrides)
        return make_settings(**values)

    return make


def wait_started(settings: Settings, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until a worker reports the call STARTED; its meta (``pid``, ``hostname``)."""
    from tool_workers.app import create_app

    app = create_app(settings)
    client = redis.Redis.from_url(settings.backend_url)
    key = app.backend.get_key_for_task(task_id)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            raw = client.get(key)
            if raw is not None:
                meta = json.loads(raw)
                if meta["status"] == "STARTED":
                    return dict(meta["result"])
            time.sleep(0.02)
    finally:
        client.close()
    raise AssertionError(f"call {task_id} did not start within {timeout} s")


def result_state(settings: Settings, task_id: str) -> str | None:
    """The Celery state stored for a call (``None`` if nothing is stored)."""
    from tool_workers.app import create_app

    app = create_app(settings)
    client = redis.Redis.from_url(settings.backend_url)
    try:
        raw = client.get(app.backend.get_key_for_task(task_id))
    finally:
        client.close()
    return None if raw is None else str(json.loads(raw)["status"])
