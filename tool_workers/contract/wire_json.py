"""JSON for graph values that cross the wire: state fields, context, Command updates.

LangChain messages travel as ``{"__lc_message__": message_to_dict(m)}`` and come back as
messages; pydantic models and dataclasses travel as their fields. Anything else that is
not JSON is refused with an error naming where it was found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from pydantic import BaseModel

MESSAGE_KEY = "__lc_message__"


class NotJSONError(ValueError):
    """Raised when a value that must cross the wire cannot be JSON; names where it is."""


def to_wire(value: Any, where: str) -> Any:
    """``value`` as plain JSON data.

    Raises:
        NotJSONError: some part of ``value`` cannot be JSON (the message names it).
    """
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, BaseMessage):
        return {MESSAGE_KEY: message_to_dict(value)}
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJSONError(f"{where} has a key that is not a string: {key!r}")
            out[key] = to_wire(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_wire(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, BaseModel):
        return to_wire(value.model_dump(mode="json"), where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_wire(dataclasses.asdict(value), where)
    raise NotJSONError(f"{where} is a {type(value).__name__}, which cannot be sent as JSON")


def from_wire(value: Any) -> Any:
    """Plain JSON data back as values, messages revived."""
    if isinstance(value, dict):
        if set(value) == {MESSAGE_KEY}:
            return messages_from_dict([value[MESSAGE_KEY]])[0]
        return {key: from_wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_wire(item) for item in value]
    return value
