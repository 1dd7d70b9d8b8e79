"""The public names of both packages are what their ``__all__`` says (as httpx checks its own)."""

from __future__ import annotations
import __future__

import subprocess
import sys
import types
from pathlib import Path

import pytest

import orchestrator
import tool_workers

REPO = Path(__file__).resolve().parents[2]


def public_names(package: types.ModuleType) -> set[str]:
    """Names bound in the package that are neither private, submodules nor __future__ flags
    (the orchestrator's are bound on first use: each is looked up first)."""
    for name in getattr(package, "_HOMES", ()):
        getattr(package, name)
    return {
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and value is not __future__.annotations
    }


@pytest.mark.parametrize("package", [orchestrator, tool_workers], ids=lambda p: p.__name__)
def test_given_package_then_all_names_exist(package: types.ModuleType) -> None:
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert missing == []


@pytest.mark.parametrize("package", [orchestrator, tool_workers], ids=lambda p: p.__name__)
def test_given_package_then_all_is_exactly_its_public_names(package: types.ModuleType) -> None:
    assert sorted(package.__all__) == sorted(public_names(package))
    assert len(package.__all__) == len(set(package.__all__))


@pytest.mark.parametrize("name", orchestrator.__all__)
def test_given_orchestrator_export_then_it_has_a_docstring(name: str) -> None:
    doc = getattr(orchestrator, name).__doc__
    assert doc is not None and doc.strip(), f"orchestrator.{name} has no docstring"


def test_given_tool_author_then_worker_side_names_are_public() -> None:
    # What a tool reads about its call, how it says it is alive, and the settings type a
    # module's get_tools(settings) receives.
    assert {"current_call", "heartbeat", "Settings", "CallContext"} <= set(tool_workers.__all__)


def test_given_agent_author_then_readme_names_are_public() -> None:
    wanted = {
        "CeleryToolMiddleware",
        "RemoteToolNode",
        "discover_tools",
        "with_deadline",
        "close_pending_calls",
        "aclose_pending_calls",
        "Dispatcher",
        "CeleryDispatcher",
        "InProcessDispatcher",
        "ToolfleetError",
    }
    assert wanted <= set(orchestrator.__all__)


def test_given_fresh_interpreter_when_tool_workers_imported_then_no_celery_app_built() -> None:
    code = (
        "import sys, tool_workers\n"
        "from tool_workers import Settings, current_call, heartbeat\n"
        "assert 'tool_workers.celery' not in sys.modules, 'tool_workers.celery imported'\n"
        "assert 'celery' not in sys.modules, 'celery imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_given_orchestrator_import_then_no_heavy_library_is_loaded() -> None:
    """Importing the package (as the ``toolfleet`` command does first) loads neither
    LangChain, LangGraph nor Celery: Ctrl-C in a command's first moments meets no import."""
    code = (
        "import sys, orchestrator.cli; "
        "print(sorted(m for m in ('langchain', 'langgraph', 'celery', 'kombu', 'redis') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
