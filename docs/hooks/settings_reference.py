"""MkDocs hook: the configuration reference, generated from the settings model.

``docs/configuration.md`` holds two markers; at build time each becomes a table made from
the model itself, so the reference cannot drift from the code:

- ``<!-- settings-reference -->``: every field of ``tool_workers.contract.settings.Settings``
  with its environment variable, type, default and description (the attribute docstring
  under the field);
- ``<!-- policy-reference -->``: every key of a tool's policy (``ToolPolicy``), likewise.

``tests/unit/test_docs.py`` checks that every field appears in the generated page.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `mkdocs build` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

from tool_workers.contract.settings import Settings, ToolPolicy  # noqa: E402

SETTINGS_MARKER = "<!-- settings-reference -->"
POLICY_MARKER = "<!-- policy-reference -->"


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The attribute docstrings of a model's fields (the string right under each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    (cls,) = tree.body
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    for statement, following in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = following.value.value
    return docs


def prose(docstring: str, names: dict[str, str] | None = None) -> str:
    """A docstring as one line of Markdown: reST's ````code```` becomes ```code```, and a
    field named in it (``names``: field to what the reader sets) is shown as the reader
    sets it (``max_runs`` as ``TOOLFLEET_MAX_RUNS``)."""
    text = " ".join(inspect.cleandoc(docstring).split())
    names = names or {}
    return re.sub(r"``(.+?)``", lambda m: f"`{names.get(m[1], m[1])}`", text)


_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}


def type_text(annotation: Any, sequence: str = "comma-separated list") -> str:
    """A field's type in words: ``path, optional``, ``comma-separated list``, ..."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " or ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " or ".join(type_text(a, sequence) for a in args)
        return f"{inner}, optional" if len(args) < len(typing.get_args(annotation)) else inner
    if origin is tuple:
        return sequence
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds_text(field: FieldInfo) -> str:
    """The field's constraints (``> 0``, ``at least 16 characters``), if any."""
    parts = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Gt):
            parts.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Ge):
            parts.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Lt):
            parts.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.Le):
            parts.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length} characters")
    return ", ".join(parts)


def default_text(field: FieldInfo, toml: bool = False) -> str:
    """A field's default as a reader would set it (``toml``: in the policy file)."""
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if value in ("", ()):
        return "empty"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple):
        value = "[" + ", ".join(f'"{v}"' for v in value) + "]" if toml else ",".join(value)
    elif isinstance(value, str) and toml:
        value = f'"{value}"'
    text = f"`{value}`"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        text += f" ({value // (1024 * 1024)} MiB)"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_table() -> str:
    """Markdown table of every setting: variable, type, default, description."""
    prefix = Settings.model_config.get("env_prefix", "")
    docs = field_docs(Settings)
    variables = {name: f"{prefix}{name.upper()}" for name in Settings.model_fields}
    rows = ["| Variable | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        kind = type_text(field.annotation)
        if bounds := bounds_text(field):
            kind = f"{kind}, {bounds}"
        description = prose(docs.get(name, ""), variables)
        if field.repr is False:
            description += " A secret: never logged or shown."
        variable = f"`{variables[name]}`"
        cells = (variable, kind, default_text(field), description)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


POLICY_DEFAULTS = {"queue": "its tool queue, `tool:<name>:<version>`"}
"""Policy keys whose default is not the model's value: a tool with no ``queue`` (of its
own or under ``[defaults]``) is routed by tool (``ToolPolicies.explicit_queue``)."""


def policy_table() -> str:
    """Markdown table of every per-tool policy key: key, type, default, description."""
    docs = field_docs(ToolPolicy)
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, field in ToolPolicy.model_fields.items():
        kind = type_text(field.annotation, sequence="list of strings")
        if bounds := bounds_text(field):
            kind = f"{kind}, {bounds}"
        default = POLICY_DEFAULTS.get(name) or default_text(field, toml=True)
        cells = (f"`{name}`", kind, default, prose(docs.get(name, "")))
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


def render(markdown: str) -> str:
    """A page's Markdown with each marker replaced by its generated table."""
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_table())
    if POLICY_MARKER in markdown:
        markdown = markdown.replace(POLICY_MARKER, policy_table())
    return markdown


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: each page's Markdown before it is rendered."""
    return render(markdown)
