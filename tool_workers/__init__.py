"""toolfleet's worker side: ``celery -A tool_workers worker``.

Importing this package builds nothing: Celery's ``-A tool_workers`` finds the app in
:mod:`tool_workers.celery` (the worker, :mod:`tool_workers.runtime.worker`), which loads
the tool modules named by ``TOOLFLEET_TOOL_MODULES`` and registers one task per tool.

::

    contract/       what both sides import: models, names, settings, signing, ...
    runtime/        the worker: tool loading, one task per tool, running a call
    celery_ext/     toolfleet's extensions of Celery, kombu and billiard
    compat/         other libraries' private names it uses, one module per library
    observability/  metrics and traces
    builtin/        the built-in toolset
    celery.py       ``-A tool_workers`` finds the worker's app here
    health.py       ``python -m tool_workers.health``: a worker's container healthcheck
"""

from __future__ import annotations

# The wire contract.
from tool_workers.contract.models import PROTOCOL_VERSION, ToolRequest, ToolResult
from tool_workers.contract.settings import Settings

# What a tool author needs on the worker side, none of it importing Celery.
from tool_workers.runtime.context import CallContext, current_call
from tool_workers.runtime.progress import heartbeat

__all__ = [
    "PROTOCOL_VERSION",
    "CallContext",
    "Settings",
    "ToolRequest",
    "ToolResult",
    "current_call",
    "heartbeat",
]
