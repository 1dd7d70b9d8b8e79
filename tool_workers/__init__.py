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

import importlib as _importlib
import typing

if typing.TYPE_CHECKING:
    from tool_workers.contract.models import PROTOCOL_VERSION, ToolRequest, ToolResult
    from tool_workers.contract.settings import Settings
    from tool_workers.runtime.context import CallContext, current_call
    from tool_workers.runtime.progress import heartbeat

# Resolved on first use (PEP 562): the orchestrator imports only ``tool_workers.contract``,
# and every import of a submodule runs this file first, so an eager import here would
# load the worker's runtime into every orchestrator process.
_HOMES = {
    # The wire contract.
    "PROTOCOL_VERSION": "tool_workers.contract.models",
    "ToolRequest": "tool_workers.contract.models",
    "ToolResult": "tool_workers.contract.models",
    "Settings": "tool_workers.contract.settings",
    # What a tool author needs on the worker side, none of it importing Celery.
    "CallContext": "tool_workers.runtime.context",
    "current_call": "tool_workers.runtime.context",
    "heartbeat": "tool_workers.runtime.progress",
}

__all__ = [
    "PROTOCOL_VERSION",
    "CallContext",
    "Settings",
    "ToolRequest",
    "ToolResult",
    "current_call",
    "heartbeat",
]


def __getattr__(name: str) -> typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tool_workers' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
