"""langchain-core's private names, in one place.

``BaseTool.run`` reads the type hints of the tool class's own ``_run`` on every call (to
find a ``RunnableConfig`` parameter), and LangChain's tool classes write them as text
(postponed annotations), so each call evaluates them again. :func:`run_methods` names the
methods whose annotations a worker evaluates once, at load
(:func:`tool_workers.runtime.loader.resolve_annotations`).

Each call also inspects again what cannot change between calls: the signatures of the
tool's ``_run`` and function (``inspect.signature``, for a ``run_manager``, ``callbacks``
or ``RunnableConfig`` parameter) and the annotations of its argument schema (for
injected arguments), about a tenth of a worker's CPU per call.
:func:`memoize_introspection` has the tool modules of langchain-core read each of them
once per function or schema class: the same answers, computed by langchain-core's own
functions.
"""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.tools import BaseTool
from langchain_core.tools import base as tools_base
from langchain_core.tools import simple as tools_simple
from langchain_core.tools import structured as tools_structured

PINNED: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "BaseTool._run": (BaseTool, "_run", ("self",)),
    "BaseTool._arun": (BaseTool, "_arun", ("self",)),
    "tools.base._signature_parameters": (tools_base, "_signature_parameters", ("obj",)),
    "tools.base._get_runnable_config_param": (
        tools_base,
        "_get_runnable_config_param",
        ("func",),
    ),
    "tools.base.get_all_basemodel_annotations": (
        tools_base,
        "get_all_basemodel_annotations",
        ("cls",),
    ),
    "tools.structured._signature_parameters": (
        tools_structured,
        "_signature_parameters",
        ("obj",),
    ),
    "tools.structured._get_runnable_config_param": (
        tools_structured,
        "_get_runnable_config_param",
        ("func",),
    ),
    "tools.simple._signature_parameters": (tools_simple, "_signature_parameters", ("obj",)),
    "tools.simple._get_runnable_config_param": (
        tools_simple,
        "_get_runnable_config_param",
        ("func",),
    ),
}
"""Each private name: (owner, attribute, the leading parameters it must take)."""

_MEMOIZED = "__toolfleet_memoized__"
"""Attribute marking a function of :func:`memoize_introspection` (installed once)."""


def run_methods(tool: BaseTool) -> tuple[Any, Any]:
    """The ``_run`` and ``_arun`` functions of ``tool``'s class."""
    cls = type(tool)
    return cls._run, cls._arun


def _per_function(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``read(func)``, computed once per plain function (a bound method's by its
    function: its signature is the function's without the first parameter). Any other
    callable (a partial, an object with ``__call__``) is read each time, as before."""
    bound: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
    plain: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def memoized(func: Any) -> Any:
        if isinstance(func, types.MethodType) and isinstance(func.__func__, types.FunctionType):
            table, key = bound, func.__func__
        elif isinstance(func, types.FunctionType):
            table, key = plain, func
        else:
            return read(func)
        try:
            return table[key]
        except KeyError:
            value = table[key] = read(func)
            return value

    functools.update_wrapper(memoized, read)
    setattr(memoized, _MEMOIZED, read)
    return memoized


def _per_class(
    read: Callable[..., dict[str, Any]],
) -> Callable[..., dict[str, Any]]:
    """``read(cls, default_to_bound=...)`` once per class and flag; each caller gets its
    own copy (langchain-core adds to the dict it is given). Anything but a class (a
    subscripted generic) is read each time."""
    tables: dict[bool, weakref.WeakKeyDictionary[type, dict[str, Any]]] = {
        True: weakref.WeakKeyDictionary(),
        False: weakref.WeakKeyDictionary(),
    }

    def memoized(cls: Any, *, default_to_bound: bool = True) -> dict[str, Any]:
        if not isinstance(cls, type):
            return read(cls, default_to_bound=default_to_bound)
        table = tables[bool(default_to_bound)]
        try:
            found = table[cls]
        except KeyError:
            found = table[cls] = read(cls, default_to_bound=default_to_bound)
        return dict(found)

    functools.update_wrapper(memoized, read)
    setattr(memoized, _MEMOIZED, read)
    return memoized


def memoize_introspection() -> None:
    """Have langchain-core's tool modules inspect each tool function's signature and type
    hints, and each argument schema's annotations, once (in this process; idempotent).

    Call it once the tools are loaded (their annotations resolved): what is read is kept
    for as long as the function or class lives.
    """
    signature: Callable[[Any], Mapping[str, inspect.Parameter]] = _first(
        tools_base.__dict__["_signature_parameters"]
    )
    config_param: Callable[[Any], str | None] = _first(tools_base._get_runnable_config_param)
    params = _per_function(signature)
    config = _per_function(config_param)
    for module in (tools_base, tools_structured, tools_simple):
        setattr(module, "_signature_parameters", params)  # noqa: B010
        setattr(module, "_get_runnable_config_param", config)  # noqa: B010
    annotations = _first(tools_base.get_all_basemodel_annotations)
    setattr(tools_base, "get_all_basemodel_annotations", _per_class(annotations))  # noqa: B010


def _first(func: Any) -> Any:
    """The langchain-core function behind ``func`` (itself unless memoized here)."""
    return getattr(func, _MEMOIZED, func)
