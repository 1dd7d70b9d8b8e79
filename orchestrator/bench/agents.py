"""The agents the benchmarks run: scripted models that time themselves, local and remote.

Every agent is ``create_agent`` with a :class:`~orchestrator.scripted.ScriptedChatModel`,
so the model costs microseconds and what is measured is the tool phase. The local
baseline has the real built-in tools and no toolfleet middleware (its tools run in a
local ``ToolNode``), and again with a pass-through middleware of the same hooks as
toolfleet's (:class:`SameHooks`); the remote agent binds the schema-only tools the
workers publish and adds :class:`~orchestrator.middleware.CeleryToolMiddleware`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool

from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from orchestrator.tools import discover_tools

PAYLOAD = {"messages": [("user", "go")]}
RUN_CONFIG = {"recursion_limit": 100_000}
"""Sync and async runs alike: no ``max_concurrency`` (a sync fan-out wider than LangGraph's
pool goes out at full width: see :mod:`orchestrator.dispatch.ahead`)."""


@dataclass
class Marks:
    """When the model handed out its tool calls, and when it was called again."""

    model_out: list[float] = field(default_factory=list)
    model_in: list[float] = field(default_factory=list)

    def clear(self) -> None:
        """Forget the marks of earlier runs."""
        self.model_out.clear()
        self.model_in.clear()

    def tool_phase(self) -> float:
        """Seconds from the first AIMessage with tool calls to the next model call."""
        return self.model_in[0] - self.model_out[0]


def one_turn_model(
    calls: Sequence[tuple[str, dict[str, Any]]], marks: Marks | None = None
) -> ScriptedChatModel:
    """Calls ``calls`` in one AIMessage, then answers; records ``marks`` if given."""

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        if messages[-1].type == "human":
            message = tool_calls_message(calls)
            if marks is not None:
                marks.model_out.append(time.perf_counter())
            return message
        if marks is not None:
            marks.model_in.append(time.perf_counter())
        return AIMessage(content="done")

    return ScriptedChatModel(policy=policy)


@dataclass
class Window:
    """Until when (``perf_counter`` time) looping models keep calling tools."""

    end: float = 0.0


def looping_model(tool: str, args: dict[str, Any], window: Window) -> ScriptedChatModel:
    """Calls ``tool`` once per turn until ``window.end``, then answers."""

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        if time.perf_counter() < window.end:
            return tool_calls_message([(tool, args)])
        return AIMessage(content="done")

    return ScriptedChatModel(policy=policy)


def turns_model(calls: Sequence[tuple[str, dict[str, Any]]], turns: int) -> ScriptedChatModel:
    """Calls ``calls`` in one AIMessage per turn for ``turns`` turns, then answers.

    The turn is counted from the conversation, not kept in the model, so one agent can
    serve many concurrent runs.
    """

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        done = sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)
        if done < turns:
            return tool_calls_message(calls)
        return AIMessage(content="done")

    return ScriptedChatModel(policy=policy)


def local_tools() -> list[BaseTool]:
    """The real ``sleep`` and ``echo`` tools, for the local ``ToolNode`` baseline."""
    # The only place the orchestrator side imports tool code: the baseline runs it here.
    from tool_workers.builtin.diagnostics import diagnostic_tools

    return diagnostic_tools()


def local_agent(model: ScriptedChatModel) -> Any:
    """``create_agent`` with the real tools and no toolfleet: tools run in this process."""
    return create_agent(model, local_tools())


class SameHooks(AgentMiddleware):
    """A middleware with the hooks :class:`CeleryToolMiddleware` has (model call, tool
    call, after model; sync and async), each passing straight on: what LangChain's agent
    costs with such a middleware in it, and no toolfleet."""

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        return await handler(request)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        return await handler(request)

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return None

    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return None


def hooks_agent(model: ScriptedChatModel) -> Any:
    """:func:`local_agent` with :class:`SameHooks`: the tools run here, through the hooks."""
    return create_agent(model, local_tools(), middleware=[SameHooks()])


def fleet_agent(model: ScriptedChatModel, dispatcher: CeleryDispatcher) -> Any:
    """``create_agent`` with the workers' tools and :class:`CeleryToolMiddleware`."""
    tools = discover_tools(dispatcher=dispatcher, require=["sleep", "echo"], wait=30)
    return create_agent(model, tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)])


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    """The ToolMessages of a final state."""
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


class Runner:
    """Runs agents sync (``invoke``) or async (``ainvoke`` on one long-lived event loop).

    One loop for every async run, as a server would have, so sync and async runs can be
    interleaved and no run pays for creating a loop.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, agent: Any, mode: str, timeout: float = 120.0) -> dict[str, Any]:
        """One run of ``agent`` in ``mode`` (``"sync"`` or ``"async"``); its final state."""
        if mode == "sync":
            return agent.invoke(PAYLOAD, RUN_CONFIG)  # type: ignore[no-any-return]
        return self.loop.run_until_complete(
            asyncio.wait_for(agent.ainvoke(PAYLOAD, RUN_CONFIG), timeout)
        )

    def gather(self, agents: Sequence[Any], timeout: float = 120.0) -> list[dict[str, Any]]:
        """Run every agent once, concurrently, on the loop (async)."""

        async def all_runs() -> list[dict[str, Any]]:
            return list(await asyncio.gather(*(a.ainvoke(PAYLOAD, RUN_CONFIG) for a in agents)))

        return self.loop.run_until_complete(asyncio.wait_for(all_runs(), timeout))

    def close(self) -> None:
        """Close the event loop."""
        self.loop.close()


def check_results(state: dict[str, Any], expected: int) -> None:
    """Raise if a run did not get ``expected`` successful ToolMessages."""
    messages = tool_messages(state)
    failed = [m for m in messages if m.status != "success"]
    if len(messages) != expected or failed:
        detail = failed[0].content if failed else f"{len(messages)} results"
        raise RuntimeError(f"benchmark run expected {expected} results, got: {detail}")
