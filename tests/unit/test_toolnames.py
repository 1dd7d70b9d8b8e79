"""Who may serve a tool name (tool_workers.contract.toolnames), as workers check it at
their start and orchestrators route by it."""

from __future__ import annotations

import pytest

from orchestrator.dispatch.registry import served_versions
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.models import ToolSpec, WorkerEntry
from tool_workers.contract.settings import Settings, ToolPolicies
from tool_workers.contract.toolnames import BUILTIN_NAMES, MODULE, mcp_source, owner, refusal
from tool_workers.runtime.loader import BUILTIN_MODULE, tools_of_module
from tool_workers.runtime.registry import check_names

CODE = {"type": "object", "properties": {"code": {"type": "string"}}}
CODE_V2 = {**CODE, "properties": {**CODE["properties"], "timeout": {"type": "number"}}}


def spec(name: str, source: str, parameters: dict[str, object] = CODE) -> ToolSpec:
    return ToolSpec(name=name, parameters=parameters, source=source)


def entry(worker: str, *specs: ToolSpec) -> WorkerEntry:
    return WorkerEntry(worker=worker, pid=1, queues=["tools"], tools=list(specs), updated_at=0)


def test_the_built_in_names_are_the_built_in_modules_tools() -> None:
    names = {tool.name for tool in tools_of_module(BUILTIN_MODULE, Settings())}
    assert names == BUILTIN_NAMES


def test_an_mcp_tool_named_like_a_built_in_is_refused_even_with_no_worker_live() -> None:
    reason = refusal("run_python", mcp_source("lookalike"), [])
    assert reason is not None and "built-in" in reason and "REGISTRY_SHARED_NAMES" in reason
    assert refusal("run_python", mcp_source("lookalike"), [], shared={"run_python"}) is None


def test_a_name_another_source_serves_is_refused_first_come_first_served() -> None:
    assert refusal("lookup", MODULE, [mcp_source("crm")]) is not None
    assert refusal("lookup", mcp_source("other"), [mcp_source("crm")]) is not None
    assert refusal("lookup", mcp_source("crm"), [mcp_source("crm")]) is None
    assert refusal("lookup", mcp_source("other"), [MODULE], shared=("lookup",)) is None


def test_versions_from_modules_roll_and_workers_that_say_no_source_are_left_alone() -> None:
    """Given a module's tool live, then another module's tool of that name (its next
    release, tests/fleet_tools_v2) may start; a worker from before sources were
    published neither refuses nor is refused."""
    assert refusal("add", MODULE, [MODULE]) is None
    assert refusal("add", "", [mcp_source("crm")]) is None
    assert refusal("add", mcp_source("crm"), [""]) is None


def test_check_names_refuses_a_worker_with_one_line() -> None:
    live = [entry("built-in", spec("run_python", MODULE))]
    with pytest.raises(ConfigError, match="does not start: tool name 'run_python' of mcp:x"):
        check_names(live, [spec("echo", MODULE), spec("run_python", mcp_source("x"))], ())
    check_names(live, [spec("run_python", MODULE, CODE_V2)], ())


def test_the_orchestrator_drops_an_offer_of_a_name_another_source_owns() -> None:
    """Given the built-in worker and an MCP worker both live with a ``run_python`` of the
    same schema (started together, before either could see the other), then models are
    shown the built-in's, and the MCP worker's offer counts for nothing; listed as
    shared, both are versions of one tool."""
    entries = [
        entry("a-lookalike", spec("run_python", mcp_source("lookalike"))),
        entry("z-built-in", spec("run_python", MODULE)),
    ]
    served = served_versions(entries, ToolPolicies(), set())
    (only,) = served["run_python"].values()
    assert only.source == MODULE
    assert owner("run_python", [mcp_source("lookalike")]) == MODULE
    shared = served_versions(entries, ToolPolicies(), set(), shared=("run_python",))
    (picked,) = shared["run_python"].values()  # the lexically first worker's, as before
    assert picked.source == mcp_source("lookalike")


def test_the_setting_is_read_as_comma_separated_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLEET_REGISTRY_SHARED_NAMES", "run_python, lookup")
    assert Settings().registry_shared_names == ("run_python", "lookup")
