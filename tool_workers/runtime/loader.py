"""Find the LangChain tools a worker serves in the modules it is told to load.

A tool module is an ordinary Python module. It provides its tools in one of three ways,
checked in this order:

1. ``get_tools(settings)`` (or ``get_tools()``) returning a list of tools;
2. a module-level ``tools`` list;
3. every module-level :class:`~langchain_core.tools.BaseTool` instance.

A tool function's annotations written as strings (a module with ``from __future__ import
annotations``) are evaluated once, here (:func:`inspect.get_annotations`): LangChain
reads a tool function's type hints on every call, and evaluating strings each time cost
a third of a trivial call's time on the worker.
"""

from __future__ import annotations

import importlib
import inspect
import traceback
from collections.abc import Iterable
from typing import Any

from langchain_core.tools import BaseTool

from tool_workers.compat.langchain_core import memoize_introspection, run_methods
from tool_workers.contract.errors import ToolLoadError
from tool_workers.contract.settings import Settings
from tool_workers.contract.toolnames import MODULE, mcp_source

BUILTIN_MODULE = "tool_workers.builtin"


def load_tools(settings: Settings) -> list[BaseTool]:
    """Import every module in ``settings.tool_modules`` (or the built-ins) and collect
    tools, and those of the MCP servers in ``settings.mcp_servers``.

    Raises:
        ToolLoadError: a module does not import, holds no tools, or two tools share a name.
    """
    # A worker for MCP servers serves their tools alone unless modules are named too.
    modules = settings.tool_modules or (() if settings.mcp_servers else (BUILTIN_MODULE,))
    found: dict[str, tuple[str, BaseTool]] = {}
    for module_name in modules:
        for tool in tools_of_module(module_name, settings):
            if tool.name in found and found[tool.name][1] is not tool:
                raise ToolLoadError(
                    f"tool name {tool.name!r} is defined in both {found[tool.name][0]} "
                    f"and {module_name}"
                )
            found[tool.name] = (module_name, tool)
    if settings.mcp_servers:
        try:
            from tool_workers.mcp.tools import mcp_tools
        except ImportError as exc:  # an mcp release toolfleet does not support, or none
            raise ToolLoadError(
                "cannot load MCP support for TOOLFLEET_MCP_SERVERS (is the mcp extra "
                f"installed, pip install 'toolfleet[mcp]'?): {cause(exc)}"
            ) from exc
        for tool in mcp_tools(settings, settings.policies()):
            if tool.name in found:
                raise ToolLoadError(
                    f"tool name {tool.name!r} is defined in both {found[tool.name][0]} "
                    "and an MCP server (TOOLFLEET_MCP_SERVERS)"
                )
            found[tool.name] = ("TOOLFLEET_MCP_SERVERS", tool)
    tools = [tool for _, tool in found.values()]
    for tool in tools:
        resolve_annotations(tool)
    # Each call then finds the signatures and schema annotations read already.
    memoize_introspection()
    return tools


def tool_sources(tools: Iterable[BaseTool], settings: Settings) -> dict[str, str]:
    """The source of each tool by name (:mod:`tool_workers.contract.toolnames`): its MCP
    server's, or a module's."""
    servers: dict[str, str] = {}
    if settings.mcp_servers:
        from tool_workers.mcp.tools import McpTool

        servers = {t.name: mcp_source(t.server) for t in tools if isinstance(t, McpTool)}
    return {tool.name: servers.get(tool.name, MODULE) for tool in tools}


def resolve_annotations(tool: BaseTool) -> None:
    """Evaluate the string annotations of ``tool``'s functions once (each stays as it was
    when one of its annotations cannot be evaluated).

    Its own functions, and its class's ``_run`` and ``_arun``: ``BaseTool.run`` reads the
    type hints of ``_run`` on every call (to find a ``RunnableConfig`` parameter), and
    LangChain's own tool classes write them as text (postponed annotations), so each call
    would evaluate them again (about 30 µs of a worker's CPU per call). The hints are the
    same either way.
    """
    for fn in (getattr(tool, "func", None), getattr(tool, "coroutine", None), *run_methods(tool)):
        annotations = getattr(fn, "__annotations__", None)
        if not inspect.isfunction(fn) or not annotations:
            continue
        if not any(isinstance(a, str) for a in annotations.values()):
            continue
        try:
            fn.__annotations__ = inspect.get_annotations(fn, eval_str=True)
        except Exception:  # a name defined later, or only under TYPE_CHECKING: kept as text
            continue


def tools_of_module(module_name: str, settings: Settings) -> list[BaseTool]:
    """The tools one module provides.

    Raises:
        ToolLoadError: the module does not import or provides no tools.
    """
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            # The named module itself (or its package) is missing, not one it imports.
            raise ToolLoadError(
                f"cannot import tool module {module_name!r} (TOOLFLEET_TOOL_MODULES): no module "
                f"named {exc.name!r} on this worker's path; run the worker from the project's "
                "directory or install its package"
            ) from exc
        raise ToolLoadError(f"cannot import tool module {module_name!r}: {cause(exc)}") from exc
    except Exception as exc:
        raise ToolLoadError(f"cannot import tool module {module_name!r}: {cause(exc)}") from exc
    provided: Iterable[Any]
    factory = getattr(module, "get_tools", None)
    if callable(factory):
        takes_settings = bool(inspect.signature(factory).parameters)
        try:
            provided = factory(settings) if takes_settings else factory()
        except Exception as exc:
            raise ToolLoadError(f"{module_name}.get_tools() failed: {cause(exc)}") from exc
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


def cause(exc: BaseException) -> str:
    """``exc`` as one line: its type, its message and where it was raised.

    The place is the innermost frame outside the import machinery, so a tool module
    that imports a missing dependency names its own line, and a syntax error its line.
    """
    where = None
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}"
        message = exc.msg
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _internal(f.filename)]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
        message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    text = " ".join(text.split())  # one line, whatever the message holds
    return f"{text} (at {where})" if where else text


def _internal(filename: str) -> bool:
    return filename.startswith("<frozen") or filename in (importlib.__file__, __file__)
