"""What the ``toolfleet`` commands show while they run, and where they print.

* :class:`InFlight`: the calls an agent step has asked for and whose results are not in
  yet, each with the time it has been running, for a rich ``Live`` display (redrawn a few
  times a second on a terminal; nothing on a pipe, where the finished lines suffice).
* :func:`elapsed`: a live line with the time a long step has taken so far.
* :func:`cli_console`: a console that is as wide as the terminal, and on a pipe wide
  enough that tables are not cut to rich's default 80 columns.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import IO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

# Columns of output that is not a terminal (and names no COLUMNS): a table row of a
# status or a benchmark fits, where rich's 80 would cut it.
PIPE_WIDTH = 200


def cli_console(file: IO[str] | None = None) -> Console:
    """A rich console for a command's output on ``file`` (stdout)."""
    stream = file or sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS"):
        return Console(file=file)
    return Console(file=file, width=PIPE_WIDTH)


class InFlight:
    """Calls asked for and not answered yet, rendered with their elapsed time."""

    def __init__(self) -> None:
        self._started: dict[str, tuple[str, float]] = {}

    def start(self, call_id: str, name: str, at: float | None = None) -> None:
        """Note a call the model asked for."""
        self._started[call_id] = (name, time.monotonic() if at is None else at)

    def finish(self, call_id: str) -> None:
        """Note that a call's result is in."""
        self._started.pop(call_id, None)

    def __len__(self) -> int:
        return len(self._started)

    def render(self, now: float | None = None) -> Text:
        """One line: how many calls run, each with its elapsed seconds."""
        now = time.monotonic() if now is None else now
        if not self._started:
            return Text("")
        calls = ", ".join(
            f"{name} {now - started:.1f}s"
            for name, started in sorted(self._started.values(), key=lambda c: c[1])
        )
        return Text(f"  … {len(self._started)} call(s) in flight: {calls}", style="dim")

    def __rich__(self) -> Text:
        return self.render()


@contextlib.contextmanager
def elapsed(console: Console, what: str) -> Iterator[None]:
    """While the block runs, a live line ``what`` with a spinner and the time elapsed.

    For steps that take a minute and print nothing meanwhile (a benchmark scenario); it
    goes away when the block ends (on a pipe it never shows).
    """
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        progress.add_task(what, total=None)
        yield
