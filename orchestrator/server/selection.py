"""What a search answers of each item, as LangGraph's server does: only the fields of
``select``, values picked out by ``extract`` paths, and the filter on state ``values``.

A path is a field of the item, then keys and list indexes: ``values.messages[-1].content``.
A path that does not resolve picks ``None``; keys starting with ``_`` never resolve. A
step into a value that is not JSON yet (a message of the state) reads its JSON form, the
one the client is answered with (a message's ``content``, ``type``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.server.encoding import dumps, loads

_STEP = re.compile(r"\.|\[")


def picked(item: dict[str, Any], select: Iterable[str] | None) -> dict[str, Any]:
    """``item`` with only the fields of ``select`` (all of them for none)."""
    if not select:
        return item
    wanted = set(select)
    return {k: v for k, v in item.items() if k in wanted}


def extracted(item: Mapping[str, Any], extract: Mapping[str, str]) -> dict[str, Any]:
    """The value at each path of ``extract`` in ``item``, under its alias."""
    return {alias: value_at(item, path) for alias, path in extract.items()}


def value_at(item: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` (``field.key[index]...``) in ``item``; ``None`` if none."""
    parts = _STEP.split(path)
    current: Any = item.get(parts[0])
    for part in parts[1:]:
        if current is None:
            return None
        if not part:
            continue
        if part.startswith("_"):
            return None
        if not isinstance(current, dict | list | str | int | float | bool):
            current = loads(dumps(current))
        if part.endswith("]"):
            try:
                index = int(part[:-1])
                current = current[index] if isinstance(current, list) else None
            except (ValueError, IndexError):
                return None
        elif isinstance(current, dict):
            current = current.get(part)
        else:
            return None
    return current


def contains(whole: Any, part: Mapping[str, Any]) -> bool:
    """Whether the object ``whole`` has every key of ``part`` with its value, nested
    objects compared key by key (PostgreSQL's ``@>`` on objects, as LangGraph's server
    filters thread values)."""
    if not isinstance(whole, dict):
        return False
    for key, value in part.items():
        if key not in whole:
            return False
        if isinstance(value, dict) and isinstance(whole[key], dict):
            if not contains(whole[key], value):
                return False
        elif whole[key] != value:
            return False
    return True
