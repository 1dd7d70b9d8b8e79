"""What the CLI shows while calls run, and how wide it prints on a pipe."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from orchestrator.cli.progress import PIPE_WIDTH, InFlight, cli_console, elapsed


def test_in_flight_calls_show_with_their_elapsed_time() -> None:
    in_flight = InFlight()
    in_flight.start("c1", "sleep", at=100.0)
    in_flight.start("c2", "grep", at=101.0)
    in_flight.finish("c2")
    in_flight.start("c3", "run_python", at=102.5)

    text = in_flight.render(now=112.0).plain

    assert "2 call(s) in flight" in text
    assert "sleep 12.0s" in text
    assert "run_python 9.5s" in text
    assert "grep" not in text


def test_nothing_shows_once_every_result_is_in() -> None:
    in_flight = InFlight()
    in_flight.start("c1", "sleep", at=0.0)
    in_flight.finish("c1")

    assert len(in_flight) == 0
    assert in_flight.render(now=1.0).plain == ""


def test_a_pipe_gets_wide_tables_not_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)

    assert cli_console(io.StringIO()).width == PIPE_WIDTH


def test_a_long_step_shows_its_elapsed_time_on_a_terminal() -> None:
    """A benchmark scenario is not a minute of silence: a live line names it and counts."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)

    with elapsed(console, "scenario fanout running"):
        time.sleep(0.6)

    assert "scenario fanout running" in out.getvalue()
    assert "0:00:0" in out.getvalue()
