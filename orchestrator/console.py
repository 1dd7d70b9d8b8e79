"""The ``toolfleet`` console script's entry point.

It imports nothing but the CLI, and does so under a Ctrl-C guard: the CLI's own imports
(typer, rich, its commands) take a moment, and a Ctrl-C then ends the command as one
later does, with exit code 130 and one line, never a traceback.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Import the CLI and run it (:func:`orchestrator.cli.main`)."""
    try:
        from orchestrator.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()
        os._exit(130)
    run()
