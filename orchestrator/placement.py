"""Where each tool call runs: on the workers, or here through the normal handler.

Agents combine tools: the user's (served by workers), tools other middleware adds (a
todo list, a virtual filesystem that lives in graph state), tools the user keeps local.
A call goes to the workers when, in this order:

1. ``placement={"tool": "local" | "remote"}`` says so (and stays here when the fleet's
   tool of that name yielded to the agent's own, see :mod:`orchestrator.offering`);
2. the tool exists here only by its schema (``discover_tools()``) or not at all;
3. the tool object says so (``tool.metadata["toolfleet_placement"]``);
4. a live worker serves a tool of that name *with the same arguments* (a different tool
   of the same name, such as Deep Agents' state-backed ``read_file``, stays local);
5. the tool policy file configures it (its workers may be starting: it waits for them).

Every other call runs in this process, unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from orchestrator.tools import RemoteTool
from tool_workers.contract.models import ToolSpec

log = logging.getLogger("toolfleet.orchestrator")

Placement = Literal["local", "remote"]
METADATA_KEY = "toolfleet_placement"
"""``tool.metadata`` key a tool can pin its placement with."""


def _argument_names(parameters: Mapping[str, Any]) -> frozenset[str]:
    return frozenset((parameters.get("properties") or {}).keys())


def takes_arguments(parameters: Mapping[str, Any], args: Mapping[str, Any]) -> bool:
    """Whether a tool with the JSON schema ``parameters`` takes ``args`` by name: each
    required argument given, none it does not name."""
    required = set(parameters.get("required") or ())
    named = _argument_names(parameters)
    return required <= args.keys() and args.keys() <= named


class PlacementRules:
    """Decides, and remembers, where calls of each tool run."""

    def __init__(
        self,
        overrides: Mapping[str, Placement] | None = None,
        configured: Iterable[str] = (),
    ) -> None:
        bad = {k: v for k, v in (overrides or {}).items() if v not in ("local", "remote")}
        if bad:
            raise ValueError(f"placement must be 'local' or 'remote': {bad}")
        self._overrides = dict(overrides or {})
        self._configured = set(configured)
        self._local_args: dict[int, tuple[BaseTool, frozenset[str]]] = {}
        self._yielded: set[str] = set()

    def yield_to(self, names: Iterable[str]) -> None:
        """The agent's own tools of these names keep their calls, whatever the workers
        serve under the same names (the model is bound to the agent's tool)."""
        self._yielded.update(names)

    def decide(
        self, name: str, tool: BaseTool | None, served: Mapping[str, ToolSpec]
    ) -> tuple[Placement, str]:
        """Where a call of ``name`` runs, and why."""
        if name in self._overrides:
            return self._overrides[name], "placement override"
        if name in self._yielded and tool is not None and not isinstance(tool, RemoteTool):
            return "local", "the fleet's tool of that name yields to this one"
        if tool is None:
            return "remote", "not defined here"
        if isinstance(tool, RemoteTool):
            return "remote", "schema-only tool"
        pinned = (tool.metadata or {}).get(METADATA_KEY)
        if pinned in ("local", "remote"):
            return pinned, "pinned by the tool"
        spec = served.get(name)
        if spec is not None:
            if self._arguments(tool) == _argument_names(spec.parameters):
                return "remote", "served by a worker"
            return "local", "a worker serves a different tool of that name"
        if name in self._configured:
            return "remote", "configured for the workers"
        return "local", "no worker serves it"

    def _arguments(self, tool: BaseTool) -> frozenset[str]:
        cached = self._local_args.get(id(tool))
        if cached is not None and cached[0] is tool:
            return cached[1]
        try:
            names = _argument_names(convert_to_openai_tool(tool)["function"]["parameters"])
        except Exception:  # a tool whose schema cannot be rendered is not the served one
            names = frozenset({"<unrenderable>"})
        self._local_args[id(tool)] = (tool, names)
        return names

    def table(
        self, tools: Iterable[BaseTool], served: Mapping[str, ToolSpec]
    ) -> dict[str, dict[str, str]]:
        """``{tool: {"placement": ..., "reason": ...}}`` for every tool of an agent."""
        out = {}
        for tool in tools:
            placement, reason = self.decide(tool.name, tool, served)
            out[tool.name] = {"placement": placement, "reason": reason}
        return out


def describe(table: Mapping[str, Mapping[str, str]]) -> str:
    """One log line: which tools run where."""
    remote = sorted(name for name, row in table.items() if row["placement"] == "remote")
    local = sorted(name for name, row in table.items() if row["placement"] == "local")
    return f"tool placement: remote={remote} local={local}"
