"""The package boundary and the import graph: what may import what.

Dependencies point one way: the agent-facing modules of ``orchestrator`` use the
transport (``orchestrator.dispatch``), which uses the wire contract of ``tool_workers``.
Imports inside functions count: a cycle hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.dispatch.base import Dispatcher
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.dispatch.in_process import InProcessDispatcher

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "tool_workers")

CONTRACT = "tool_workers.contract"
"""The one part of ``tool_workers`` the orchestrator may import: the contract subpackage
(models, names, settings, errors, signing, JSON, connections, logs, the Celery app both
sides build). The package itself (``tool_workers``: current_call, heartbeat, Settings)
is for tool authors, not for the orchestrator."""


def in_contract(module: str) -> bool:
    return module == CONTRACT or module.startswith(CONTRACT + ".")


COMPAT = ("tool_workers.compat", "orchestrator.compat")
"""The modules that hold other libraries' private names (one per library). They are
leaves: they import nothing of toolfleet, so the contract may use the worker's."""


def in_compat(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in COMPAT)


RUNS_THE_WORKER = {
    "orchestrator.dispatch.in_process": {
        "tool_workers.runtime.execute",
        "tool_workers.runtime.registry",
        "tool_workers.runtime.tasks",
    },
    "orchestrator.bench.agents": {"tool_workers.builtin.diagnostics"},
}
"""The exceptions, which run worker code in this process on purpose: the in-process
dispatcher (fast tests), and the benchmark's local ``ToolNode`` baseline (the same tool
code, run without toolfleet)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield module_name(path), path


MODULES = dict(sources())


def imported(name: str, path: Path) -> set[str]:
    """Modules of the two packages that ``name`` imports, wherever the import stands."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # ``from pkg import submodule`` imports the submodule.
                full = f"{base}.{alias.name}"
                targets.append(full if full in MODULES else base)
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def test_given_tool_workers_then_it_never_imports_the_orchestrator() -> None:
    offenders = {
        name: sorted(t for t in targets if t.startswith("orchestrator"))
        for name, targets in GRAPH.items()
        if name.startswith("tool_workers")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_given_orchestrator_then_it_imports_only_the_workers_contract() -> None:
    offenders = {}
    for name, targets in GRAPH.items():
        if not name.startswith("orchestrator"):
            continue
        allowed = RUNS_THE_WORKER.get(name, set())
        outside = sorted(
            t
            for t in targets
            if t.startswith("tool_workers")
            and not in_contract(t)
            and not in_compat(t)  # leaves: one library's names each (the mcp SDK's)
            and t not in allowed
        )
        if outside:
            offenders[name] = outside
    assert offenders == {}


def test_given_both_packages_then_no_import_cycle() -> None:
    # Tarjan's strongly connected components; any component of two or more is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(GRAPH.get(node, ())):
            # A package's own __init__ re-exporting its modules is not a dependency of
            # theirs; a module importing its package's __init__ still is one.
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    assert cycles == []


def test_given_tool_workers_then_at_most_twelve_top_level_modules() -> None:
    top = [p for p in (REPO / "tool_workers").glob("*.py")]
    assert len(top) <= 12, sorted(p.name for p in top)


def test_given_the_contract_then_it_imports_nothing_else_of_tool_workers() -> None:
    # What the orchestrator imports must not pull the worker's runtime in behind it. The
    # worker's compat modules are leaves (see the next test): they pull nothing in.
    offenders = {
        name: sorted(
            t
            for t in targets
            if t.startswith("tool_workers.") and not in_contract(t) and not in_compat(t)
        )
        for name, targets in GRAPH.items()
        if in_contract(name)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_given_the_compat_modules_then_they_import_nothing_of_toolfleet() -> None:
    # GRAPH holds only imports of the two packages: a compat module should have none.
    offenders = {name: sorted(targets) for name, targets in GRAPH.items() if in_compat(name)}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_given_orchestrator_then_at_most_twenty_top_level_modules() -> None:
    top = [p for p in (REPO / "orchestrator").glob("*.py")]
    assert len(top) <= 20, sorted(p.name for p in top)


def protocol_members() -> list[str]:
    return [
        name
        for name in dir(Dispatcher)
        if not name.startswith("_")
        and name not in dir(object)
        and name not in ("settings", "policies")
    ]


@pytest.mark.parametrize("implementation", [CeleryDispatcher, InProcessDispatcher])
def test_given_dispatcher_then_it_implements_every_method_of_the_interface(
    implementation: type,
) -> None:
    for name in protocol_members():
        declared = getattr(Dispatcher, name)
        assert hasattr(implementation, name), f"{implementation.__name__} lacks {name}"
        if isinstance(declared, property):
            continue  # an attribute: its type is mypy's to check
        method = getattr(implementation, name)
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(declared), name
        wanted = list(inspect.signature(declared).parameters)
        assert list(inspect.signature(method).parameters) == wanted, name


def test_given_orchestrator_then_no_caller_probes_a_dispatcher_with_getattr() -> None:
    probes = []
    for name, path in MODULES.items():
        if not name.startswith("orchestrator"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and "dispatcher" in ast.unparse(node.args[0])
            ):
                probes.append(f"{name}: {ast.unparse(node)}")
    assert probes == []


AGENT_SIDE = (
    "import orchestrator.dispatch",
    "import orchestrator",
    "import orchestrator.middleware",
    "from orchestrator import discover_tools",
    "from orchestrator import CeleryToolMiddleware; CeleryToolMiddleware()",
)
"""What an agent author's process does before it calls a tool, in order: none of it may
load worker code, whatever the source's import lines say (a package ``__init__`` runs for
every import of a module under it)."""


def worker_modules_after(steps: tuple[str, ...]) -> dict[str, list[str]]:
    """The worker-side modules loaded after each step, run in order in a new interpreter."""
    probe = ["import os, sys", "os.environ['TOOLFLEET_BROKER_URL'] = 'redis://127.0.0.1:1/0'"]
    for step in steps:
        probe += [
            step,
            "print('', *sorted(m for m in sys.modules if m.startswith('tool_workers.')))",
        ]
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(probe)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded: dict[str, list[str]] = {}
    for line, step in zip(done.stdout.splitlines(), steps, strict=True):
        loaded[step] = [m for m in line.split() if not in_contract(m) and not in_compat(m)]
    return loaded


def test_given_the_agent_side_then_no_worker_module_is_loaded() -> None:
    assert worker_modules_after(AGENT_SIDE) == {step: [] for step in AGENT_SIDE}


def test_given_the_in_process_dispatcher_then_the_runtime_loads_only_when_it_is_used() -> None:
    first, second = (
        "from orchestrator.dispatch import Dispatcher",
        "from orchestrator.dispatch import InProcessDispatcher",
    )
    loaded = worker_modules_after((first, second))
    assert loaded[first] == []
    assert "tool_workers.runtime.tasks" in loaded[second]
