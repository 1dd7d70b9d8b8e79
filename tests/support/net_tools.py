"""Tools the network-fault tests serve: side effects counted in a file, not in Redis.

A worker cut off from Redis can still write to the file system, so the count is right
whatever the network does. ``TOOLFLEET_TEST_EFFECTS_FILE`` names the file; each start and
each end of a run is one line: ``start|alive|end|stopped <idempotency key> <pid> <unix time>``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from langchain_core.tools import tool

from tool_workers import current_call


def _record(event: str) -> None:
    ctx = current_call()
    key = ctx.idempotency_key if ctx else "no-call"
    path = Path(os.environ["TOOLFLEET_TEST_EFFECTS_FILE"])
    with path.open("a") as out:
        out.write(f"{event} {key} {os.getpid()} {time.time():.3f}\n")


def read_effects(path: Path) -> list[tuple[str, str, int, float]]:
    """Every recorded event: (kind, idempotency key, pid, unix time), in order."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        event, key, pid, at = line.split()
        events.append((event, key, int(pid), float(at)))
    return events


@tool
def step(seconds: float) -> str:
    """Records its start, sleeps ``seconds``, records its end (or when a limit stopped it)."""
    _record("start")
    try:
        time.sleep(seconds)
    except BaseException:  # the soft time limit: when it fired is what the tests check
        _record("stopped")
        raise
    _record("end")
    return f"slept {seconds:g}"


@tool
def pay(seconds: float) -> str:
    """A non-idempotent ``step``: recorded the same way, never to be run twice."""
    _record("start")
    time.sleep(seconds)
    _record("end")
    return f"paid after {seconds:g}"


@tool
def stubborn(seconds: float) -> str:
    """Ignores its soft time limit (only the hard limit stops it); records ``alive`` each
    second, so the last record tells when the hard limit ended it."""
    _record("start")
    deadline = time.monotonic() + seconds
    next_tick = time.monotonic()
    while time.monotonic() < deadline:
        try:
            if time.monotonic() >= next_tick:
                _record("alive")
                next_tick += 1.0
            time.sleep(0.05)
        except BaseException:  # swallowing the soft time limit is the point
            continue
    _record("end")
    return "outlived its limits"
