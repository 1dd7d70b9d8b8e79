"""A deterministic tool-calling chat model: replays a script, needs no API key.

Used by ``toolfleet demo`` when no model is named, by the benchmarks and by the tests,
and by anyone who wants to run an agent over their own tools without an API key::

    model = ScriptedChatModel(script=[
        [("read_file", {"path": "README.md"}), ("grep", {"pattern": "TODO"})],  # one turn
        "Done.",                                                              # the answer
    ])

A script step is a list of ``(tool name, args)`` pairs (one AIMessage calling them all,
in parallel), a string (the final answer), an AIMessage (returned as is; a tool call
whose ``id`` is ``None`` gets a unique one), or a function of the conversation so far
returning any of these.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, PrivateAttr

Turn = AIMessage | str | Sequence[tuple[str, dict[str, Any]]]
"""What a model call answers: an AIMessage, a final answer, or ``(tool, args)`` calls."""

Step = Turn | Callable[[Sequence[BaseMessage]], Turn]

SCRIPTED = "toolfleet:scripted"
"""Model spec naming the scripted demo model (the default when no model is named)."""


class ScriptedChatModel(BaseChatModel):
    """Replays ``script`` one step per model call; ``policy`` decides when there is none.

    Args:
        script: Steps returned in order, one per call (shared by every run of the model).
        policy: Called with the conversation when the script is used up (or empty).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: list[Any] = []
    policy: Callable[[Sequence[BaseMessage]], Turn] | None = None
    _position: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "toolfleet-scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        """The script decides which tools are called; binding changes nothing."""
        return self

    @property
    def calls(self) -> int:
        """How many times the model was called."""
        with self._lock:
            return self._position

    def _next(self, messages: Sequence[BaseMessage]) -> AIMessage:
        with self._lock:
            position = self._position
            self._position += 1
        if position < len(self.script):
            step = self.script[position]
        elif self.policy is not None:
            step = self.policy
        else:
            raise RuntimeError(f"script exhausted after {len(self.script)} model calls")
        return as_message(step(messages) if callable(step) else step)

    # A script has no use for the stop words or the run manager.
    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._next(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return self._generate(messages)


def as_message(turn: Turn) -> AIMessage:
    """A script step's answer as the AIMessage the model returns."""
    if isinstance(turn, str):
        return AIMessage(content=turn)
    if not isinstance(turn, AIMessage):
        return tool_calls_message(list(turn))
    return _with_ids(turn)


def _with_ids(message: AIMessage) -> AIMessage:
    if not message.tool_calls or all(tc.get("id") for tc in message.tool_calls):
        return message
    calls = [
        {**tc, "id": tc.get("id") or f"call_{uuid.uuid4().hex[:16]}"} for tc in message.tool_calls
    ]
    return message.model_copy(update={"tool_calls": calls})


def tool_calls_message(calls: Sequence[tuple[str, dict[str, Any]]], content: str = "") -> AIMessage:
    """An AIMessage calling each ``(tool name, args)`` in order, with fresh call ids."""
    return AIMessage(
        content=content,
        tool_calls=[
            {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:16]}", "type": "tool_call"}
            for name, args in calls
        ],
    )
