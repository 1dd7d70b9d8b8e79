"""The scenarios ``toolfleet bench`` runs, by id and name (what ``--help`` lists)."""

from __future__ import annotations

SCENARIOS = {
    "a": "latency",
    "b": "fanout",
    "c": "throughput",
    "d": "memory",
    "e": "scale",
    "f": "links",
    "g": "cost",
}
"""Scenario ids and their names (``--only`` takes either)."""

NOT_QUICK = ("scale", "links")
"""Scenarios ``--quick`` leaves out unless ``--only`` names them (each starts hosts and
workers of its own: tens of seconds on their own)."""


def listing() -> str:
    """Every scenario as ``a latency, b fanout, ...``."""
    return ", ".join(f"{key} {name}" for key, name in SCENARIOS.items())


def quick_listing() -> str:
    """The scenarios ``--quick`` runs by default, as ``a latency, ...``."""
    return ", ".join(f"{key} {name}" for key, name in SCENARIOS.items() if name not in NOT_QUICK)
