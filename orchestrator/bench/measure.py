"""Measurement primitives of ``toolfleet bench``: summaries, memory, bounded runs."""

from __future__ import annotations

import math
import os
import statistics
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


SETTLE = 0.5
"""Seconds the cost scenario's counters keep running after a window's last result,
untimed: work a call leaves behind (an acknowledgement after the result, deferred
clean-up) is its cost too."""


class ScenarioTimeout(Exception):
    """Raised when a scenario does not finish within its time bound."""


def summarise(samples: Sequence[float]) -> dict[str, float]:
    """Count, median, p99 (nearest rank), mean, min and max of ``samples``.

    An empty sample set summarises to zeros with ``count`` 0, so reports stay numeric.
    """
    if not samples:
        return {"count": 0, "median": 0.0, "p99": 0.0, "mean": 0.0, "min": 0.0, "max": 0.0}
    ordered = sorted(samples)
    rank = max(1, math.ceil(0.99 * len(ordered)))
    return {
        "count": len(ordered),
        "median": statistics.median(ordered),
        "p99": ordered[rank - 1],
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
        "max": ordered[-1],
    }


def added_latency(with_it: Sequence[float], without: Sequence[float]) -> dict[str, float]:
    """:func:`summarise` of what one thing adds per call, from samples taken in pairs.

    ``with_it[i]`` and ``without[i]`` are one round of interleaved runs; the summary is of
    the per-round differences. (The difference of two p99s is no p99 of anything: with a
    heavier tail on the ``without`` side it fell below the difference of the medians.)
    """
    return summarise([a - b for a, b in zip(with_it, without, strict=True)])


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm`` (0 where absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (0 if it is gone or not local)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def bounded(
    fn: Callable[[], T],
    timeout: float,
    what: str,
    *,
    stop: Callable[[], None],
    grace: float = 30.0,
) -> T:
    """Run ``fn`` in a daemon thread and return its result within ``timeout`` seconds.

    A sync agent run cannot be interrupted from outside; a scenario that hangs (a worker
    died, a result never came) is stopped with ``stop`` (which must make ``fn`` end: the
    bench closes the dispatchers its runs use), so that it publishes nothing into the
    scenarios after it, and waited for up to ``grace`` seconds more.

    Raises:
        ScenarioTimeout: ``fn`` did not finish in time (the message says whether it
            stopped).
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"bench-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        stop()
        thread.join(grace)
        fate = "still running" if thread.is_alive() else "stopped"
        raise ScenarioTimeout(f"{what} did not finish within {timeout:g} s ({fate})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]
