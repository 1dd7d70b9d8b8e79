"""The tool hooks' one flow: a sync hook runs it to its end with no event loop."""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest

from orchestrator.middleware import _blocking


def test_a_flow_that_never_suspends_returns_its_value_with_no_loop() -> None:
    async def flow() -> str:
        return threading.current_thread().name

    assert _blocking(flow()) == threading.current_thread().name
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_a_flow_that_raises_raises_in_its_caller() -> None:
    async def flow() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        _blocking(flow())


def test_a_flow_that_would_suspend_is_refused_and_closed() -> None:
    finished = []

    @types.coroutine
    def suspend() -> Any:
        yield  # what a coroutine does to wait for an event loop

    async def flow() -> None:
        try:
            await suspend()
        finally:
            finished.append(True)

    with pytest.raises(RuntimeError, match="suspended"):
        _blocking(flow())
    assert finished == [True]
