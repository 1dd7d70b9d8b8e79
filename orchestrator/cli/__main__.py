"""``python -m orchestrator.cli``: the ``toolfleet`` command."""

from orchestrator.cli import main

main()
