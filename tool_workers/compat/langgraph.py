"""LangGraph's private names, in one place.

A worker runs a tool outside any graph, yet the tool may ask LangGraph for its run's
context (``get_runtime()``, ``get_stream_writer()``, ``get_store()``), and LangGraph
reads those from the invoke config under a key it keeps private:
:func:`with_runtime` and :func:`runtime_of` put the runtime there and read it back.
No public API sets it short of running a graph around each call.

Which arguments of a tool LangGraph injects (``InjectedState`` and its field,
``InjectedStore``, ``ToolRuntime``) is decided by a private function of its ``ToolNode``;
:func:`injected_params` asks it, so a worker injects exactly what ``ToolNode`` would
(an own reading of the annotations could drift from LangGraph's rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph._internal import _constants
from langgraph.prebuilt import tool_node
from langgraph.runtime import Runtime

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "_internal._constants.CONFIG_KEY_RUNTIME": (_constants, "CONFIG_KEY_RUNTIME", ()),
    "prebuilt.tool_node._get_all_injected_args": (
        tool_node,
        "_get_all_injected_args",
        ("tool",),
    ),
    "prebuilt.tool_node._InjectedArgs": (
        tool_node._InjectedArgs,
        "__init__",
        ("self", "state", "store", "runtime"),
    ),
}
"""Each private name: (owner, attribute, the leading parameters it must take)."""


@dataclass(frozen=True)
class InjectedParams:
    """The parameters of a tool LangGraph fills in itself (never from the model)."""

    state: dict[str, str | None]
    """``InjectedState`` parameters: the state field each takes (``None``: all of it)."""
    store: str | None
    """The ``InjectedStore`` parameter, if any."""
    runtime: str | None
    """The ``ToolRuntime`` parameter, if any."""


def injected_params(tool: BaseTool) -> InjectedParams:
    """The parameters of ``tool`` LangGraph's ``ToolNode`` injects (reflection on its
    type hints: call once per tool)."""
    found = tool_node._get_all_injected_args(tool)
    return InjectedParams(state=dict(found.state), store=found.store, runtime=found.runtime)


def with_runtime(configurable: dict[str, Any], runtime: Runtime[Any]) -> dict[str, Any]:
    """``configurable`` with ``runtime`` where LangGraph's ``get_runtime()``,
    ``get_stream_writer()`` and ``get_store()`` look for it."""
    return {**configurable, _constants.CONFIG_KEY_RUNTIME: runtime}


def runtime_of(config: RunnableConfig) -> Runtime[Any]:
    """The runtime :func:`with_runtime` put in ``config``'s ``configurable``."""
    runtime: Runtime[Any] = config["configurable"][_constants.CONFIG_KEY_RUNTIME]
    return runtime
