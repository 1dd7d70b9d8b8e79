"""Chat models the HTTP-service tests plug in with ``TOOLFLEET_MODEL=tests.server_models:...``.

:func:`directed` obeys the user: a message that is JSON ``{"calls": [[tool, args], ...]}``
makes it call those fleet tools at once (``"model_delay": s`` first stalls the model call
that long, to test cancelling it); any other text is echoed. Once tool results are in, it
answers ``done: <n> results: <contents>``. :func:`streaming` is the same model streaming
its answers a word at a time (token streaming, when the run streams messages).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from orchestrator.scripted import ScriptedChatModel, tool_calls_message


def _directive(messages: Sequence[BaseMessage]) -> dict[str, Any]:
    human = [m for m in messages if isinstance(m, HumanMessage)]
    try:
        directive = json.loads(str(human[-1].content)) if human else {}
    except ValueError:
        return {}
    return directive if isinstance(directive, dict) else {}


def _policy(messages: Sequence[BaseMessage]) -> AIMessage:
    last = messages[-1]
    if isinstance(last, HumanMessage):
        calls = _directive(messages).get("calls")
        if calls:
            return tool_calls_message([(name, args) for name, args in calls])
        return AIMessage(content=f"echo: {last.content}")
    results = []
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        results.insert(0, str(message.content))
    return AIMessage(content=f"done: {len(results)} results: {', '.join(results)}")


class DirectedModel(ScriptedChatModel):
    """The scripted model, with an optional stall before a model call; with
    ``stream_tokens`` it streams each answer a word at a time."""

    stream_tokens: bool = False

    def _should_stream(self, **kwargs: Any) -> bool:
        return self.stream_tokens and super()._should_stream(**kwargs)

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        delay = _directive(messages).get("model_delay")
        if delay and isinstance(messages[-1], HumanMessage):
            await asyncio.sleep(float(delay))
        return await super()._agenerate(messages, *args, **kwargs)

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        result = await self._agenerate(messages, *args, **kwargs)
        message = result.generations[0].message
        assert isinstance(message, AIMessage)
        words = re.findall(r"\S+\s*", str(message.content)) or [""]
        for i, word in enumerate(words):
            last = i == len(words) - 1
            chunk = AIMessageChunk(
                content=word,
                id=message.id,
                tool_call_chunks=[
                    {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": n}
                    for n, c in enumerate(message.tool_calls)
                ]
                if last
                else [],
                chunk_position="last" if last else None,
            )
            yield ChatGenerationChunk(message=chunk)


def directed() -> DirectedModel:
    """The model of the HTTP-service tests."""
    return DirectedModel(policy=_policy)


def streaming() -> DirectedModel:
    """The model of the HTTP-service tests, streaming its answers word by word."""
    return DirectedModel(policy=_policy, stream_tokens=True)
