"""Helpers of the fault-injection suite: real workers, real Redis, injected failures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.fleet import FAULT_POLICY
from tool_workers.settings import Settings


@pytest.fixture
def fault_settings(make_settings: Callable[..., Settings]) -> Callable[..., Settings]:
    """Settings with the fault policy: redelivery after ~11 s instead of minutes."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"config": FAULT_POLICY, "redelivery_margin": 2.0}
        values.update(overrides)
        return make_settings(**values)

    return make
