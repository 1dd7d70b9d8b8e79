"""The next release of one tool of :mod:`tests.fleet_tools`: ``add`` takes a third number.

Its schema differs, so it is another version of the tool: during a rolling upgrade both
are served at once, and each call must run on a worker of the version it was made with.
"""

from __future__ import annotations

from langchain_core.tools import tool


@tool
def add(a: int, b: int, c: int = 0) -> str:
    """Add two or three integers."""
    return f"v2:{a + b + c}"
