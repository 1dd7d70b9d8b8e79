"""The fleet's tools offered to the model by the middleware, yielding to the agent's own.

``create_agent`` puts the tools of every middleware and the ``tools=`` list into one
``ToolNode``, by name, and a ``tools=`` entry replaces a middleware's tool of the same
name without a word. Remote tools passed there (``discover_tools()``) can so take the
place of another middleware's tools: with the built-in toolset, Deep Agents'
``read_file``, ``write_file`` and ``grep`` become the workers' tools of those names, with
other arguments, on another filesystem.

``CeleryToolMiddleware(discover=True)`` offers the fleet's tools itself instead: at each
model call it adds a schema-only tool for every tool a live worker serves, after every
other middleware has had its say, so it sees what the agent already has. A served tool
whose name the agent already has yields: the agent's tool stays bound and its calls run
here, and a warning names the clash (once per name). Tools that appear on the workers
later are offered from the next model call on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool

from orchestrator.dispatch.base import Dispatcher
from orchestrator.tools import RemoteTool
from tool_workers.contract.models import ToolSpec

log = logging.getLogger("toolfleet.orchestrator")


def tool_name(tool: BaseTool | Mapping[str, Any]) -> str | None:
    """The name a model sees for ``tool`` (a tool object or a provider's tool dict)."""
    if isinstance(tool, BaseTool):
        return tool.name
    function = tool.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return str(function["name"])
    name = tool.get("name")
    return name if isinstance(name, str) else None


class ToolOffer:
    """Builds (and caches) the schema-only tools the middleware adds to model requests.

    Args:
        dispatcher: Where the offered tools' direct invocations go.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._tools: dict[str, RemoteTool] = {}
        self._warned: set[str] = set()

    def extend(
        self, tools: Sequence[Any], served: Mapping[str, ToolSpec]
    ) -> tuple[list[Any], set[str]]:
        """``tools`` with the fleet's tools added, and the served names that yielded.

        Args:
            tools: The tools of the model request.
            served: The tools the live workers serve (read by the caller, sync or async).

        A served tool yields when ``tools`` already holds a tool of that name that is not
        a fleet tool itself (another middleware's, or one the agent was given).
        """
        have: dict[str, Any] = {}
        for tool in tools:
            name = tool_name(tool)
            if name is not None:
                have[name] = tool
        yielded = {
            name for name in served if name in have and not isinstance(have[name], RemoteTool)
        }
        self._warn(yielded, served)
        added = [self._tool(served[name]) for name in sorted(served) if name not in have]
        return ([*tools, *added] if added else list(tools)), yielded

    def _tool(self, spec: ToolSpec) -> RemoteTool:
        cached = self._tools.get(spec.name)
        if cached is None or cached.spec != spec:
            cached = self._tools[spec.name] = RemoteTool.from_spec(spec, self._dispatcher)
        return cached

    def _warn(self, yielded: set[str], served: Mapping[str, ToolSpec]) -> None:
        for name in sorted(yielded - self._warned):
            self._warned.add(name)
            log.warning(
                "the fleet's tool %r (queue %s) is not offered to the model: the agent already "
                "has a tool of that name (another middleware's or its own), which keeps its "
                "calls; rename one of them to use both",
                name,
                served[name].queue,
            )
