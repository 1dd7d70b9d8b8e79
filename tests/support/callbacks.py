"""A LangChain callback handler that records every tool callback, as a tracer sees it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler


class Recorder(BaseCallbackHandler):
    """Every tool callback, with what a tracer would record of it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.events.append(
            {
                "event": "start",
                "name": serialized["name"],
                "description": serialized.get("description"),
                "input": input_str,
                "inputs": inputs,
                "has_parent": parent_run_id is not None,
                "tags": sorted(tags or []),
                "metadata": {k: v for k, v in (metadata or {}).items() if k == "user"},
            }
        )

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        self.events.append({"event": "end", "output": (type(output).__name__, output.content)})

    def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self.events.append({"event": "error", "type": type(error).__name__, "text": str(error)})
