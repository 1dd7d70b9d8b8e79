"""Both servers on one project, for tests that make the same ``langgraph-sdk`` calls to
each: ``toolfleet serve --config`` and ``langgraph dev`` (the oracle), on loopback ports,
over one prefork fleet. Plus :func:`shape`, what two answers are compared by.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from langgraph_sdk import get_client

from tests.support.fleet import REPO
from tests.support.langgraph_dev import start_langgraph_dev
from tests.support.serving import ServerProcess, run, start_server
from tool_workers.contract.settings import Settings

T = TypeVar("T")

PROJECT = REPO / "tests" / "project" / "langgraph.json"
"""The project both serve: the ``made`` graph runs without tools or a model."""


@dataclass
class ApiPair:
    """The two servers of one project."""

    toolfleet: ServerProcess
    langgraph: ServerProcess

    def client(self, server: ServerProcess, token: str | None = None) -> Any:
        """An SDK client of ``server`` (toolfleet's with its first token, or ``token``)."""
        if server is self.toolfleet:
            return get_client(url=server.url, api_key=token or server.settings.api_tokens[0])
        return get_client(url=server.url)

    def both(self, scenario: Callable[[Any], Awaitable[T]]) -> tuple[T, T]:
        """``scenario(client)`` run against toolfleet's server, then LangGraph's."""

        async def on(server: ServerProcess) -> T:
            async with self.client(server) as c:
                return await scenario(c)

        return run(on(self.toolfleet)), run(on(self.langgraph))


def api_pair(
    settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    tokens: tuple[str, ...],
    project: Path = PROJECT,
    **overrides: Any,
) -> Iterator[ApiPair]:
    """The body of a module fixture: both servers started on ``project``, then stopped
    (toolfleet's accepting ``tokens``, each a tenant of its own; ``overrides``: more
    settings of toolfleet's)."""
    ours = start_server(
        settings,
        tmp_path_factory.mktemp("parity-toolfleet"),
        "parity",
        args=("--config", str(project)),
        model=None,
        api_tokens=tokens,
        **overrides,
    )
    try:
        theirs = start_langgraph_dev(settings, project, tmp_path_factory.mktemp("parity-lg"))
    except BaseException:
        ours.stop()
        raise
    try:
        yield ApiPair(ours, theirs)
    finally:
        theirs.stop()
        ours.stop()


def shape(value: Any) -> Any:
    """``value`` with every scalar replaced by its JSON type name: what stays when ids,
    times and texts are set aside. ``int`` and ``float`` are both ``number``."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


async def status_of(call: Awaitable[Any]) -> int:
    """The HTTP status an SDK call ends with (200 when it returns)."""
    try:
        await call
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200


THREAD_GAPS = ("interrupts",)
"""Fields of a ``Thread`` where the servers differ on every thread endpoint (toolfleet
answers its ``interrupts`` map on every thread, LangGraph's server only once the thread
has a state): set aside when the answers are compared."""


def drop(value: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``value`` without ``keys``."""
    return {k: v for k, v in value.items() if k not in keys}
