"""Find the LangChain tools a worker serves in the modules it is told to load.

A tool module is an ordinary Python module. It provides its tools in one of three ways,
checked in this order:

1. ``get_tools(settings)`` (or ``get_tools()``) returning a list of tools;
2. a module-level ``tools`` list;
3. every module-level :class:`~langchain_core.tools.BaseTool` instance.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from typing import Any

from langchain_core.tools import BaseTool

from tool_workers.errors import ToolLoadError
from tool_workers.settings import Settings

BUILTIN_MODULE = "tool_workers.builtin"


def load_tools(settings: Settings) -> list[BaseTool]:
    """Import every module in ``settings.tool_modules`` (or the built-ins) and collect tools.

    Raises:
        ToolLoadError: a module does not import, holds no tools, or two tools share a name.
    """
    modules = settings.tool_modules or (BUILTIN_MODULE,)
    found: dict[str, tuple[str, BaseTool]] = {}
    for module_name in modules:
        for tool in tools_of_module(module_name, settings):
            if tool.name in found and found[tool.name][1] is not tool:
                raise ToolLoadError(
                    f"tool name {tool.name!r} is defined in both {found[tool.name][0]} "
                    f"and {module_name}"
                )
            found[tool.name] = (module_name, tool)
    return [tool for _, tool in found.values()]


def tools_of_module(module_name: str, settings: Settings) -> list[BaseTool]:
    """The tools one module provides.

    Raises:
        ToolLoadError: the module does not import or provides no tools.
    """
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ToolLoadError(f"cannot import tool module {module_name!r}: {exc!r}") from exc
    provided: Iterable[Any]
    factory = getattr(module, "get_tools", None)
    if callable(factory):
        takes_settings = bool(inspect.signature(factory).parameters)
        try:
            provided = factory(settings) if takes_settings else factory()
        except Exception as exc:
            raise ToolLoadError(f"{module_name}.get_tools() failed: {exc!r}") from exc
    elif isinstance(getattr(module, "tools", None), (list, tuple)):
        provided = module.tools
    else:
        provided = [value for value in vars(module).values() if isinstance(value, BaseTool)]
    tools = list(provided)
    bad = [repr(t) for t in tools if not isinstance(t, BaseTool)]
    if bad:
        raise ToolLoadError(f"{module_name} provides objects that are not tools: {bad}")
    if not tools:
        raise ToolLoadError(f"tool module {module_name!r} provides no tools")
    return tools
