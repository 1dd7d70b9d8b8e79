"""A whole-run deadline: a run's tool calls must finish by a given time."""

from __future__ import annotations

import time
from typing import Any

DEADLINE_KEY = "toolfleet_deadline"
"""``config["configurable"]`` key holding a run's deadline (Unix time)."""


def with_deadline(seconds: float, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run config whose tool calls must finish within ``seconds`` from now.

    When the deadline passes, the run's in-flight calls are revoked (terminated on prefork
    workers), calls not yet sent are never sent, a call still queued is not run (its
    message expires then: Celery's ``expires``), and the run raises
    :class:`~tool_workers.contract.errors.RunDeadlineExceeded`.

    Example::

        agent.invoke(inputs, with_deadline(30, {"configurable": {"thread_id": "t1"}}))
    """
    config = dict(config or {})
    config["configurable"] = {
        **(config.get("configurable") or {}),
        DEADLINE_KEY: time.time() + seconds,
    }
    return config
