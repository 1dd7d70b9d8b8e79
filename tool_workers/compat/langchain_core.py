"""langchain-core's private names, in one place.

``BaseTool.run`` reads the type hints of the tool class's own ``_run`` on every call (to
find a ``RunnableConfig`` parameter), and LangChain's tool classes write them as text
(postponed annotations), so each call evaluates them again. :func:`run_methods` names the
methods whose annotations a worker evaluates once, at load
(:func:`tool_workers.runtime.loader.resolve_annotations`).
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "BaseTool._run": (BaseTool, "_run", ("self",)),
    "BaseTool._arun": (BaseTool, "_arun", ("self",)),
}
"""Each private name: (owner, attribute, the leading parameters it must take)."""


def run_methods(tool: BaseTool) -> tuple[Any, Any]:
    """The ``_run`` and ``_arun`` functions of ``tool``'s class."""
    cls = type(tool)
    return cls._run, cls._arun
