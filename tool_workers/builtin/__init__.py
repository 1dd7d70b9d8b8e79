"""The built-in toolset, served by workers when ``TOOLFLEET_TOOL_MODULES`` is empty.

=============  =======================================================================
Tool           What it does
=============  =======================================================================
read_file      numbered lines of a text file in the workspace, paged by offset/limit
list_dir       entries of a workspace directory with type and size
grep           regex search over the workspace's text files (``path:line: text``)
write_file     create or atomically replace a workspace file
run_python     run a snippet in a supervised, time-, memory- and process-limited tree
sleep          sleep a given time (benchmarks)
echo           return the text it is given (latency benchmarks)
=============  =======================================================================

The file tools are confined to ``settings.workspace_root`` (created if missing); see
:mod:`tool_workers.builtin.workspace`. ``run_python`` is not a security sandbox; see
:mod:`tool_workers.builtin.sandbox`. The default policy in ``config/toolfleet.toml`` routes
it to the ``sandbox`` queue and marks it and ``write_file`` as not idempotent.
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from tool_workers.builtin.diagnostics import diagnostic_tools
from tool_workers.builtin.sandbox import sandbox_tools
from tool_workers.builtin.workspace import workspace_tools
from tool_workers.contract.settings import Settings

__all__ = ["diagnostic_tools", "get_tools", "sandbox_tools", "workspace_tools"]


def get_tools(settings: Settings) -> list[BaseTool]:
    """Build every built-in tool for ``settings.workspace_root``.

    Args:
        settings: The worker's settings: ``workspace_root``, and the policy file (the
            ``max_read_bytes`` of ``read_file``).

    Returns:
        ``read_file``, ``list_dir``, ``grep``, ``write_file``, ``run_python``, ``sleep``
        and ``echo``.

    Raises:
        OSError: the workspace root cannot be created.
        ConfigError: the policy file is invalid, or ``sandbox_uids`` is malformed.
    """
    root = settings.workspace_root.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    max_read_bytes = settings.policies().for_tool("read_file").max_read_bytes
    return [
        *workspace_tools(root.resolve(strict=True), max_read_bytes=max_read_bytes),
        *sandbox_tools(
            memory_limit_bytes=settings.sandbox_memory_limit,
            max_processes=settings.sandbox_max_processes,
            uids=settings.sandbox_uids,
            python=settings.sandbox_python,
            min_isolation=settings.sandbox_min_isolation,
            workspace=root.resolve(strict=True),
        ),
        *diagnostic_tools(),
    ]
