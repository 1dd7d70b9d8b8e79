"""``load_tools``: the tools a worker serves, found in the modules it is told to load.

Each test writes its tool modules into its own ``tmp_path`` under names no other test uses,
and forgets them afterwards, so the import cache never leaks between tests.
"""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolArg, StructuredTool, tool
from langchain_core.tools import base as tools_base
from pydantic import BaseModel, ValidationError

from tool_workers.compat.langchain_core import memoize_introspection
from tool_workers.contract.errors import ToolLoadError
from tool_workers.contract.settings import Settings
from tool_workers.runtime.loader import load_tools

BUILTIN_NAMES = {"read_file", "list_dir", "grep", "write_file", "run_python", "sleep", "echo"}

Writer = Callable[[str, str], str]


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Writer]:
    """Write ``source`` as an importable module; returns its (test-unique) name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []
    suffix = uuid.uuid4().hex[:8]

    def write(stem: str, source: str) -> str:
        name = f"tf_{stem}_{suffix}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TOOLFLEET_* variable of the calling shell (TOOL_MODULES above all) leaks in."""
    for name in list(os.environ):
        if name.startswith("TOOLFLEET_"):
            monkeypatch.delenv(name)


def names(settings: Settings) -> list[str]:
    return [t.name for t in load_tools(settings)]


FACTORY_WITH_SETTINGS = """
    from langchain_core.tools import StructuredTool

    def get_tools(settings):
        def where() -> str:
            "Say where the workspace is."
            return str(settings.workspace_root)
        return [StructuredTool.from_function(where)]
"""

FACTORY_WITHOUT_SETTINGS = """
    from langchain_core.tools import tool

    def get_tools():
        @tool
        def ping() -> str:
            "Ping."
            return "pong"
        return [ping]
"""

TOOLS_LIST = """
    from langchain_core.tools import tool

    @tool
    def alpha() -> str:
        "Alpha."
        return "a"

    @tool
    def beta() -> str:
        "Beta."
        return "b"

    @tool
    def hidden() -> str:
        "Not in the list, so not served."
        return "h"

    tools = [alpha, beta]
"""

MODULE_LEVEL = """
    from langchain_core.tools import tool

    @tool
    def gamma() -> str:
        "Gamma."
        return "g"

    @tool
    def delta() -> str:
        "Delta."
        return "d"

    def helper():
        return 1
"""


# --- the three ways a module provides tools ---------------------------------------------


def test_given_module_with_get_tools_settings_when_loaded_then_factory_gets_settings(
    write_module: Writer, tmp_path: Path
) -> None:
    module = write_module("factory", FACTORY_WITH_SETTINGS)
    settings = Settings(tool_modules=(module,), workspace_root=tmp_path / "ws")

    [where] = load_tools(settings)

    assert where.name == "where"
    assert where.invoke({}) == str(tmp_path / "ws")


def test_given_module_with_argless_get_tools_when_loaded_then_its_tools(
    write_module: Writer,
) -> None:
    module = write_module("argless", FACTORY_WITHOUT_SETTINGS)
    assert names(Settings(tool_modules=(module,))) == ["ping"]


def test_given_module_with_tools_list_when_loaded_then_only_listed_tools(
    write_module: Writer,
) -> None:
    module = write_module("listed", TOOLS_LIST)
    assert names(Settings(tool_modules=(module,))) == ["alpha", "beta"]


def test_given_module_with_module_level_tools_when_loaded_then_all_of_them(
    write_module: Writer,
) -> None:
    module = write_module("plain", MODULE_LEVEL)
    assert sorted(names(Settings(tool_modules=(module,)))) == ["delta", "gamma"]


def test_given_several_modules_when_loaded_then_tools_of_all_in_order(
    write_module: Writer,
) -> None:
    listed = write_module("listed", TOOLS_LIST)
    argless = write_module("argless", FACTORY_WITHOUT_SETTINGS)
    assert names(Settings(tool_modules=(listed, argless))) == ["alpha", "beta", "ping"]


def test_given_module_importing_anothers_tool_when_both_loaded_then_served_once(
    write_module: Writer,
) -> None:
    plain = write_module("plain", MODULE_LEVEL)
    reexport = write_module("reexport", f"from {plain} import gamma\n")
    assert sorted(names(Settings(tool_modules=(plain, reexport)))) == ["delta", "gamma"]


# --- refusals ---------------------------------------------------------------------------


def test_given_same_tool_name_in_two_modules_when_loaded_then_tool_load_error(
    write_module: Writer,
) -> None:
    first = write_module("first", MODULE_LEVEL)
    second = write_module("second", MODULE_LEVEL)  # a distinct 'gamma' object, same name
    with pytest.raises(ToolLoadError, match=f"'gamma' is defined in both {first} and {second}"):
        load_tools(Settings(tool_modules=(first, second)))


def test_given_module_without_tools_when_loaded_then_tool_load_error(
    write_module: Writer,
) -> None:
    module = write_module("empty", "def helper():\n    return 1\n")
    with pytest.raises(ToolLoadError, match=f"{module}.*provides no tools"):
        load_tools(Settings(tool_modules=(module,)))


def test_given_tools_list_holding_non_tools_when_loaded_then_tool_load_error(
    write_module: Writer,
) -> None:
    module = write_module("junk", "tools = ['not a tool']\n")
    with pytest.raises(ToolLoadError, match="not tools"):
        load_tools(Settings(tool_modules=(module,)))


def test_given_module_failing_to_import_when_loaded_then_tool_load_error_with_cause(
    write_module: Writer,
) -> None:
    module = write_module("broken", "import definitely_not_installed_xyz\n")
    with pytest.raises(ToolLoadError, match=f"cannot import tool module '{module}'") as caught:
        load_tools(Settings(tool_modules=(module,)))
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_given_missing_module_when_loaded_then_tool_load_error() -> None:
    with pytest.raises(ToolLoadError, match="no_such_toolfleet_module"):
        load_tools(Settings(tool_modules=("no_such_toolfleet_module",)))


# --- the default ------------------------------------------------------------------------


def test_given_no_tool_modules_when_loaded_then_builtin_toolset(tmp_path: Path) -> None:
    loaded = set(names(Settings(workspace_root=tmp_path)))
    assert loaded == BUILTIN_NAMES


def test_given_get_tools_raising_when_loaded_then_tool_load_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "failing_factory.py").write_text(
        "def get_tools(settings):\n    raise RuntimeError('no credentials')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(ToolLoadError, match="no credentials"):
        load_tools(Settings(tool_modules=("failing_factory",)))


def test_given_mcp_support_that_does_not_import_when_loaded_then_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given MCP servers configured and the MCP support failing at import (an ``mcp``
    release whose names differ), when the tools are loaded, then a ToolLoadError names
    the real ImportError: an ImportError reaching Celery's ``-A tool_workers`` would be
    reported as ``Module 'tool_workers' has no attribute 'celery'``."""
    monkeypatch.setitem(sys.modules, "tool_workers.mcp.tools", None)
    servers = '{"mcpServers": {"s": {"command": "true"}}}'
    settings = Settings(tool_modules=(), mcp_servers=servers)
    with pytest.raises(ToolLoadError) as caught:
        load_tools(settings)
    message = str(caught.value)
    assert "TOOLFLEET_MCP_SERVERS" in message and "halted; None in sys.modules" in message
    assert "\n" not in message


def test_given_a_loaded_tool_then_its_run_methods_hints_are_evaluated_once_and_unchanged() -> None:
    """BaseTool.run reads the type hints of the tool class's ``_run`` on every call;
    LangChain writes them as text. Loading a tool evaluates them once: the same hints,
    no text left to evaluate again."""
    import typing

    from langchain_core.tools import StructuredTool, tool

    from tool_workers.runtime.loader import resolve_annotations

    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    hints = typing.get_type_hints(StructuredTool._run)

    resolve_annotations(echo)

    annotations = StructuredTool._run.__annotations__
    assert not any(isinstance(value, str) for value in annotations.values()), annotations
    assert typing.get_type_hints(StructuredTool._run) == hints
    assert (
        echo.invoke(
            {"type": "tool_call", "name": "echo", "args": {"text": "hi"}, "id": "c"}
        ).content
        == "hi"
    )


def test_memoized_introspection_keeps_what_a_tool_call_does() -> None:
    """With langchain-core's per-call introspection read once (memoize_introspection),
    a tool still gets its config and callbacks, injected arguments still stay out of its
    callbacks' inputs, and its arguments are still validated, call after call."""

    class Inputs(BaseModel):
        n: int
        secret: Annotated[str, InjectedToolArg]

    def count(n: int, secret: str, config: RunnableConfig, callbacks: Any = None) -> str:
        """Count, saying what it was given."""
        tag = (config.get("metadata") or {}).get("tag")
        return f"{n}:{secret}:{tag}:{callbacks is not None}"

    counted = StructuredTool.from_function(count, name="count", args_schema=Inputs)

    @tool
    def plain(text: str) -> str:
        """Echo."""
        return text

    class Inputs2(Inputs):
        extra: str = "x"

    seen: list[Any] = []

    class Handler(BaseCallbackHandler):
        def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
            seen.append(kwargs.get("inputs"))

    def run_all() -> list[Any]:
        config: RunnableConfig = {"metadata": {"tag": "t"}, "callbacks": [Handler()]}
        out: list[Any] = []
        for _ in range(2):
            out.append(counted.invoke({"n": 3, "secret": "s"}, config))
            out.append(plain.invoke({"text": "hi"}, config))
            out.append(tools_base.get_all_basemodel_annotations(Inputs2))
            with pytest.raises(ValidationError):
                counted.invoke({"n": "not a number", "secret": "s"})
        out.append(list(seen))
        seen.clear()
        return out

    before = run_all()
    memoize_introspection()
    memoize_introspection()  # idempotent: wraps langchain-core's own functions once
    after = run_all()

    assert after == before
    assert before[0] == "3:s:t:True"
    assert before[1] == "hi"
    assert before[-1] == [{"n": 3}, {"text": "hi"}] * 2
