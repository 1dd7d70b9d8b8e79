"""No module of toolfleet touches another library's private names outside its compat modules.

A private name (a leading underscore, an ``_internal`` package) of kombu, Celery,
billiard, LangGraph or any other library may change in any release. toolfleet uses the
few it cannot do without in one compat module per library (:mod:`tool_workers.compat`,
:mod:`orchestrator.compat`), where ``test_compat.py`` pins each one. This scan of every
other module's source finds:

* an import from a private module of another package (``langgraph._internal``), or of a
  private name from one;
* an attribute ``x._name`` read or set (also through ``getattr``/``setattr``/
  ``hasattr``/``delattr`` with the name spelled out) on anything but ``self``/``cls``/
  ``super()``, unless listed in :data:`ALLOWED` with its reason;
* in a class derived from another package's class: a method ``_name`` defined, or
  ``self._name``/``super()._name`` used, where ``_name`` is that class's own (its class
  attribute, or an attribute its source sets on ``self``), unless it is one of the
  documented extension points in :data:`EXTENSION_POINTS`.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "tool_workers")
COMPAT = ("orchestrator.compat", "tool_workers.compat")

ALLOWED: dict[str, str] = {
    "os._exit": "documented: ends the process without cleanup (after fork, on fatal errors)",
    "._replace": "namedtuple's documented API (the underscore avoids clashing with fields)",
    "handler._toolfleet": "toolfleet's own mark on a logging handler it installed "
    "(tool_workers.contract.logs)",
    "formatter._base": "toolfleet's own KeyValueFormatter's wrapped formatter "
    "(tool_workers.contract.logs)",
    "backend._toolfleet_scripts": "toolfleet's own scripts, cached on the result backend "
    "(tool_workers.runtime.delivery)",
    "copy._tool_run": "toolfleet's own tracer's tool run, given to its copy "
    "(tool_workers.observability.trace_parent)",
}
"""Private attributes read outside ``self``: receiver and name as written (a leading dot:
on any receiver), each with why it is not another library's private name."""

EXTENSION_POINTS: dict[str, set[str]] = {
    "langchain_core.language_models.chat_models.BaseChatModel": {
        "_generate",
        "_agenerate",
        "_stream",
        "_astream",
        "_llm_type",
    },
    "langchain_core.tools.base.BaseTool": {"_run", "_arun"},
}
"""Underscored methods a library documents for its subclasses to implement."""

GO_THROUGH_COMPAT = (
    "go through the library's compat module (tool_workers/compat or orchestrator/compat), "
    "where tests/unit/test_compat.py pins the name"
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_own(module: str) -> bool:
    return module.partition(".")[0] in PACKAGES


def is_compat(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in COMPAT)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    names: dict[str, str] = field(default_factory=dict)
    """What each top-level name is bound to: the dotted path of the module or object."""
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


def absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    anchor = module.name.split(".")
    anchor = anchor if module.path.name == "__init__.py" else anchor[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def parse(name: str, path: Path, text: str) -> Module:
    module = Module(name, path, ast.parse(text))
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.names[alias.asname] = alias.name
                else:
                    root = alias.name.partition(".")[0]
                    module.names[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = absolute(module, node)
            for alias in node.names:
                module.names[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in module.tree.body:
        if isinstance(node, ast.ClassDef):
            module.classes[node.name] = node
            module.names[node.name] = f"{module.name}.{node.name}"
    return module


def load(path: Path) -> Module:
    return parse(module_name(path), path, path.read_text(encoding="utf-8"))


MODULES = {
    module.name: module
    for module in (
        load(path) for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
    )
}


def dotted(module: Module, node: ast.expr) -> str | None:
    """The dotted path expression ``node`` names in ``module`` (``None``: not a name)."""
    if isinstance(node, ast.Subscript):  # Generic[T], a parametrized base
        return dotted(module, node.value)
    if isinstance(node, ast.Name):
        if node.id in module.names:
            return module.names[node.id]
        return f"builtins.{node.id}" if hasattr(builtins, node.id) else None
    if isinstance(node, ast.Attribute):
        root = dotted(module, node.value)
        return f"{root}.{node.attr}" if root else None
    return None


def foreign_object(path: str) -> Any:
    """The object at dotted ``path`` of another package, imported (``None``: not found)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr, None)
        return value
    return None


@functools.cache
def foreign_ancestry(path: str) -> tuple[type, ...]:
    """The classes of other packages that the class at dotted ``path`` derives from
    (itself included when it is one), resolved through toolfleet's own modules."""
    if not is_own(path):
        value = foreign_object(path)
        if not isinstance(value, type):
            return ()
        return tuple(k for k in value.__mro__ if k is not object)
    owner, _, name = path.rpartition(".")
    module = MODULES.get(owner)
    if module is None:
        return ()
    if name in module.classes:
        return class_ancestry(module, module.classes[name])
    target = module.names.get(name)  # a name the module imported (a re-export)
    return foreign_ancestry(target) if target and target != path else ()


def class_ancestry(module: Module, node: ast.ClassDef) -> tuple[type, ...]:
    """The classes of other packages that class ``node`` of ``module`` derives from."""
    found: list[type] = []
    for base in node.bases:
        target = dotted(module, base)
        for klass in foreign_ancestry(target) if target else ():
            if klass not in found:
                found.append(klass)
    return tuple(found)


@functools.cache
def source(klass: type) -> str:
    try:
        return inspect.getsource(klass)
    except (OSError, TypeError):
        return ""


def belongs_to(klass: type, name: str) -> bool:
    """Whether ``name`` is ``klass``'s own: a class attribute, or set on ``self`` by its
    source (an instance attribute)."""
    if name in vars(klass):
        return True
    return re.search(rf"\bself\.{re.escape(name)}\b", source(klass)) is not None


def qualified(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def owner_of(ancestry: tuple[type, ...], name: str) -> type | None:
    """The first class of ``ancestry`` that ``name`` belongs to, unless it documents
    ``name`` as an extension point; ``None`` when toolfleet's own."""
    for klass in ancestry:
        if name in EXTENSION_POINTS.get(qualified(klass), set()):
            return None
        if belongs_to(klass, name):
            return klass
    return None


ACCESSORS = ("getattr", "setattr", "hasattr", "delattr")


def own_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """``tree``'s nodes, those of classes nested in it left out (a class of ``tree``'s
    ``self`` is ``tree``'s; a nested class's is its own)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not (isinstance(child, ast.ClassDef) and isinstance(tree, ast.ClassDef))
        )


def attribute_uses(tree: ast.AST) -> Iterator[tuple[int, ast.expr, str]]:
    """Every ``receiver._name`` in ``tree``: (line, receiver, name); also the ones
    spelled as a ``getattr``-style call with a constant name."""
    for node in own_nodes(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            yield node.lineno, node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ACCESSORS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            yield node.lineno, node.args[0], node.args[1].value


def is_self(receiver: ast.expr) -> bool:
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    return (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Name)
        and receiver.func.id == "super"
    )


def allowed(receiver: ast.expr, name: str) -> bool:
    return f"{ast.unparse(receiver)}.{name}" in ALLOWED or f".{name}" in ALLOWED


def findings(module: Module) -> list[str]:
    """What module ``module`` touches of other libraries' private names, by line."""
    found = sorted(uses(module))
    where = module.path.relative_to(REPO)
    return [f"{where}:{line}: {what}" for line, what in found]


def uses(module: Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            source_module = node.module or ""
            if is_own(source_module):
                continue
            if any(is_private(part) for part in source_module.split(".")):
                yield node.lineno, f"imports from private module {source_module}"
            for alias in node.names:
                if is_private(alias.name):
                    yield node.lineno, f"imports private {source_module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not is_own(alias.name) and any(map(is_private, alias.name.split("."))):
                    yield node.lineno, f"imports private module {alias.name}"
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.ClassDef):
            continue
        ancestry = class_ancestry(module, node)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_private(item.name):
                owner = owner_of(ancestry, item.name)
                if owner is not None:
                    yield (
                        item.lineno,
                        f"{node.name}.{item.name} overrides {qualified(owner)}.{item.name}",
                    )
        for line, receiver, name in attribute_uses(node):
            if not is_self(receiver):
                continue
            owner = owner_of(ancestry, name)
            if owner is not None:
                yield line, f"{ast.unparse(receiver)}.{name} is {qualified(owner)}.{name}"
    for line, receiver, name in attribute_uses(module.tree):
        if is_self(receiver) or allowed(receiver, name):
            continue  # self's: checked against its class's ancestry above
        yield line, f"{ast.unparse(receiver)}.{name}"


SCANNED = [m for name, m in MODULES.items() if not is_compat(name)]


def test_no_module_outside_compat_touches_another_librarys_private_names() -> None:
    found = [finding for module in SCANNED for finding in findings(module)]
    assert not found, (
        "private names of other libraries used outside the compat modules "
        f"({GO_THROUGH_COMPAT}; a name that is toolfleet's own goes in ALLOWED of "
        "tests/unit/test_private_names.py with its reason):\n  " + "\n  ".join(found)
    )


def scan(text: str, name: str = "tool_workers.example") -> list[str]:
    """The findings in module source ``text`` (as if it were module ``name``)."""
    module = parse(name, REPO / Path(*name.split(".")).with_suffix(".py"), text)
    MODULES[name] = module
    try:
        return findings(module)
    finally:
        del MODULES[name]
        foreign_ancestry.cache_clear()


def test_the_scan_finds_each_kind_of_private_use() -> None:
    found = scan(
        "from langgraph._internal._constants import CONFIG_KEY_RUNTIME\n"
        "from langgraph.prebuilt.tool_node import _get_all_injected_args\n"
        "from celery.worker import heartbeat\n"
        "from celery.worker.request import Request\n"
        "class Heart(heartbeat.Heart):\n"
        "    def _send(self, event, retry=True):\n"
        "        return super()._send(event, retry=False)\n"
        "class Req(Request):\n"
        "    def _mine(self):\n"
        "        return self._already_revoked or self._own\n"
        "def f(pool):\n"
        "    return pool._cache, getattr(pool, '_pool')\n"
    )
    assert [f.partition(": ")[2] for f in found] == [
        "imports from private module langgraph._internal._constants",
        "imports private langgraph.prebuilt.tool_node._get_all_injected_args",
        "Heart._send overrides celery.worker.heartbeat.Heart._send",
        "super()._send is celery.worker.heartbeat.Heart._send",
        "self._already_revoked is celery.worker.request.Request._already_revoked",
        "pool._cache",
        "pool._pool",
    ]


def test_the_scan_leaves_extension_points_and_own_names_alone() -> None:
    assert (
        scan(
            "import os\n"
            "from langchain_core.tools import BaseTool\n"
            "class Tool(BaseTool):\n"
            "    def _run(self, x):\n"
            "        return self._helper(x)\n"
            "    def _helper(self, x):\n"
            "        self._count = 1\n"
            "        os._exit(0)\n"
        )
        == []
    )
