"""What a client's JSON value may hold, for every surface that takes one.

The HTTP service's request bodies (:mod:`orchestrator.server.schemas`) and MCP tool
calls (:mod:`orchestrator.mcp.server`, on stdio and on ``/mcp``) check their values here:
nesting at most :data:`MAX_DEPTH` deep, numbers within 64 bits, and no lone surrogate
(JSON may spell ``"\\ud800"``, which parses into a string no UTF-8 encoder writes: not
orjson, not Redis, not the checkpointers).
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of objects and lists accepted in a client's JSON value."""

INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""Integers JSON encoders and the checkpointers carry (64 bits)."""


def check_json(value: Any) -> Any:
    """Refuse what the encoders and checkpointers cannot store: nesting deeper than
    :data:`MAX_DEPTH`, integers beyond 64 bits, non-finite floats. The error names the
    path inside the field.

    Raises:
        ValueError: what is wrong, and where.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels at {path or '.'}")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{path}.{k}"[:200], depth + 1) for k, v in pairs)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int | float) and not INT_MIN <= item <= INT_MAX:
            # Integers and floats alike (NaN fails the comparison): one rule, and one
            # the OpenAPI document can state.
            raise ValueError(f"number beyond the 64-bit range at {path or '.'}")
    return value


def surrogate_at(value: Any) -> str | None:
    """Where in ``value`` (parsed JSON) a string or key holds a lone surrogate, which no
    UTF-8 encoder (orjson, Redis, the checkpointers) can write; ``None``: nowhere."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and any("\ud800" <= c <= "\udfff" for c in item):
                return path or "."
        elif isinstance(item, dict):
            for key, child in item.items():
                label = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and surrogate_at(key) is not None:
                    return label.encode("utf-8", "backslashreplace").decode()[:200]
                stack.append((child, label[:200]))
        elif isinstance(item, list):
            stack.extend((child, f"{path}.{i}"[:200]) for i, child in enumerate(item))
    return None


def check_encodable(value: Any) -> Any:
    """:func:`check_json`, and no lone surrogate anywhere in ``value``.

    Raises:
        ValueError: what is wrong, and where.
    """
    check_json(value)
    where = surrogate_at(value)
    if where is not None:
        raise ValueError(f"string at {where} holds a lone surrogate (not encodable as UTF-8)")
    return value
