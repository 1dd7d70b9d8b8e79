"""The worker healthcheck's ``--exit-after``: a worker whose consumer keeps failing the
check is ended (compose restarts a container that exits, never one only unhealthy)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tool_workers import health


def run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, problem: str | None
) -> tuple[int, list[tuple[int, int]]]:
    monkeypatch.setattr(health, "check", lambda *_, **__: problem)
    sent: list[tuple[int, int]] = []
    status = health.main(
        ["tool-worker@h", "--exit-after", "3", "--state-dir", str(tmp_path)],
        kill=lambda pid, sig: sent.append((pid, sig)),
    )
    return status, sent


def test_the_worker_is_ended_after_n_failed_pings_in_a_row(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Given --exit-after 3, when the consumer fails the check three times in a row,
    then the third check sends SIGQUIT to process 1 (the container's init); not before."""
    dead = f"tool-worker@h {health.NOT_ANSWERING} within 10 s"
    assert run(monkeypatch, tmp_path, dead) == (1, [])
    assert run(monkeypatch, tmp_path, dead) == (1, [])
    assert run(monkeypatch, tmp_path, dead) == (1, [(1, signal.SIGQUIT)])


def test_a_passing_check_or_a_missing_registry_entry_resets_the_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Given two failed pings, when a check passes (or only the registry entry is
    missing: the consumer answers), then the count starts again: no exit."""
    dead = f"tool-worker@h {health.NOT_ANSWERING} within 10 s"
    for between in (None, "tool-worker@h answers but has no registry entry"):
        run(monkeypatch, tmp_path, dead)
        run(monkeypatch, tmp_path, dead)
        run(monkeypatch, tmp_path, between)
        assert run(monkeypatch, tmp_path, dead)[1] == []
        run(monkeypatch, tmp_path, None)
