"""Trivial tools for benchmarks and health checks: ``sleep`` and ``echo``.

They do no real work, so their latency is the fleet's own overhead (dispatch, broker,
result collection) plus, for ``sleep``, a known amount of busy time on a worker slot.
"""

from __future__ import annotations

import time

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

__all__ = ["MAX_SLEEP", "diagnostic_tools"]

MAX_SLEEP = 3600.0


class SleepArgs(BaseModel):
    seconds: float = Field(ge=0, le=MAX_SLEEP, description="How long to sleep, in seconds.")


class EchoArgs(BaseModel):
    text: str = Field(description="Text to return unchanged.")


def sleep(seconds: float) -> str:
    """Block the calling worker slot for ``seconds``.

    Args:
        seconds: Time to sleep, 0 to :data:`MAX_SLEEP` (the schema enforces the bounds).

    Returns:
        ``"slept 0.50 s"`` for ``seconds=0.5``.
    """
    # Clamped again for direct callers that bypass the schema.
    seconds = min(max(seconds, 0.0), MAX_SLEEP)
    time.sleep(seconds)
    return f"slept {seconds:.2f} s"


def echo(text: str) -> str:
    """Return ``text`` unchanged.

    Args:
        text: Any text.

    Returns:
        ``text``.
    """
    return text


def diagnostic_tools() -> list[BaseTool]:
    """Build the ``sleep`` and ``echo`` tools.

    Returns:
        The two tools.
    """
    return [
        StructuredTool.from_function(
            sleep,
            name="sleep",
            description=f"Sleep for the given seconds (0 to {MAX_SLEEP:g}) and report it. "
            "For benchmarks and tests; it does nothing useful.",
            args_schema=SleepArgs,
        ),
        StructuredTool.from_function(
            echo,
            name="echo",
            description="Return the given text unchanged. For latency benchmarks and tests.",
            args_schema=EchoArgs,
        ),
    ]
