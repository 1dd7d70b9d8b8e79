"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from langchain_core.tools import BaseTool

from orchestrator.dispatch.in_process import InProcessDispatcher


@pytest.fixture
def dispatchers() -> Iterator[Callable[..., InProcessDispatcher]]:
    """Make in-process dispatchers (``make(tools, **options)``); all are shut down after
    the test."""
    made: list[InProcessDispatcher] = []

    def make(tools: Sequence[BaseTool], **options: Any) -> InProcessDispatcher:
        made.append(InProcessDispatcher(tools, **options))
        return made[-1]

    yield make
    for dispatcher in made:
        dispatcher.close()
