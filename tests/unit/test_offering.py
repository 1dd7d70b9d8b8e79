"""The fleet's tools offered by the middleware: added after the agent's own, yielding on
a name clash (with one warning a name), and routed accordingly."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langchain_core.tools import StructuredTool

from orchestrator.offering import ToolOffer, tool_name
from orchestrator.placement import PlacementRules
from orchestrator.tools import RemoteTool
from tool_workers.contract.models import ToolSpec


def spec(name: str, *args: str) -> ToolSpec:
    properties = {arg: {"type": "string"} for arg in args}
    return ToolSpec(name=name, parameters={"type": "object", "properties": properties})


class Served:
    """The tools the live workers serve (standing in for the dispatcher too)."""

    def __init__(self, *specs: ToolSpec) -> None:
        self.specs = {s.name: s for s in specs}

    def served_tools(self) -> dict[str, ToolSpec]:
        return self.specs


def middleware_read_file(file_path: str) -> str:
    """Read a file of the agent's state filesystem."""
    return file_path


def test_fleet_tools_are_added_after_the_agents_and_yield_on_a_clash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given an agent with its own read_file and a provider tool, and workers serving
    read_file, list_dir and echo, when the offer extends the request's tools twice, then
    list_dir and echo are added (the same objects each time), read_file stays the
    agent's, and one warning names the clash."""
    own = StructuredTool.from_function(middleware_read_file, name="read_file")
    provider: dict[str, Any] = {"type": "function", "function": {"name": "web_search"}}
    served = Served(spec("read_file", "path"), spec("list_dir", "path"), spec("echo"))
    offer = ToolOffer(served)  # type: ignore[arg-type]

    with caplog.at_level(logging.WARNING, logger="toolfleet.orchestrator"):
        first, yielded = offer.extend([own, provider], served.specs)
        second, _ = offer.extend([own, provider], served.specs)

    assert [tool_name(t) for t in first] == ["read_file", "web_search", "echo", "list_dir"]
    assert first[0] is own and all(isinstance(t, RemoteTool) for t in first[2:])
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert yielded == {"read_file"}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "fleet's tool 'read_file'" in warnings[0]


def test_a_fleet_tool_already_given_as_a_remote_tool_is_no_clash() -> None:
    served = Served(spec("echo"))
    given = RemoteTool.from_spec(served.specs["echo"])
    tools, yielded = ToolOffer(served).extend([given], served.specs)  # type: ignore[arg-type]
    assert tools == [given] and yielded == set()


def test_a_yielded_name_runs_here_even_with_the_served_tools_arguments() -> None:
    """Given a served read_file with exactly the arguments of the agent's own, then once
    it yielded, the agent's tool (the one the model is bound to) keeps the calls; calls
    by a name only the fleet has still go to the workers."""
    own = StructuredTool.from_function(middleware_read_file, name="read_file")
    served = {"read_file": spec("read_file", "file_path")}
    rules = PlacementRules()
    assert rules.decide("read_file", own, served)[0] == "remote"  # rule 4 alone

    rules.yield_to({"read_file"})

    assert rules.decide("read_file", own, served)[0] == "local"
    assert rules.decide("read_file", None, served)[0] == "remote"
