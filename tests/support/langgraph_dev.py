"""LangGraph's own server, ``langgraph dev`` (langgraph-cli, in-memory runtime), in a
subprocess on a loopback port, serving a ``langgraph.json`` project.

It runs with LangGraph's default settings (its blocking-call detector on: no
``--allow-blocking``), without a browser, analytics, version check or tracing, so it
talks to nothing but loopback; ``--no-reload`` keeps it one process, stopped by its pid.
The fleet's ``TOOLFLEET_*`` settings reach the project's graphs through its environment.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.support.serving import ServerProcess
from tool_workers.contract.settings import Settings

QUIET = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LANGSMITH_TRACING": "false",
}
"""What keeps ``langgraph dev`` off the network."""


class LangGraphDev(ServerProcess):
    """``langgraph dev --no-browser --port N`` on a project file.

    Args:
        settings: The fleet's settings (passed to the graphs as ``TOOLFLEET_*``).
        config: The project file.
        workdir: Its working directory (where it keeps its in-memory state's files).
        log_file: Where its output goes.
    """

    def __init__(self, settings: Settings, config: Path, workdir: Path, log_file: Path) -> None:
        super().__init__(settings, workdir, log_file, extra_env=QUIET)
        self.config = config

    def command(self) -> list[str]:
        """``python -m langgraph_cli dev`` on loopback with the default settings."""
        return [
            *(sys.executable, "-m", "langgraph_cli", "dev", "--no-browser", "--no-reload"),
            *("--host", "127.0.0.1", "--port", str(self.port), "--config", str(self.config)),
        ]


def start_langgraph_dev(settings: Settings, config: Path, workdir: Path) -> LangGraphDev:
    """A started ``langgraph dev`` serving ``config`` to the fleet of ``settings``.

    It runs in a copy of the project's folder: ``langgraph dev`` resolves the file's
    paths from its working directory, where it also writes its state.
    """
    project = workdir / "project"
    shutil.copytree(config.parent, project, ignore=shutil.ignore_patterns("__pycache__"))
    server = LangGraphDev(settings, project / config.name, project, workdir / "langgraph-dev.log")
    server.start(timeout=120.0)
    return server
