"""An async run's middleware hooks cost no executor thread while LangSmith does not trace.

``create_agent`` wraps each middleware's ``awrap_*`` hooks in LangSmith's ``traceable``,
which sets up and ends its run in the loop's default executor: two thread hops per hook
call, even when nothing is traced. The middleware has LangSmith run those two steps on
the event loop when the call's context is not traced (``langsmith.set_runtime_overrides``,
public), and leaves a traced call, or another override's choice, as it was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import langsmith
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from orchestrator.compat.langsmith import current_aio_to_thread
from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from orchestrator.tracing import untraced_steps_inline


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture(autouse=True)
def langsmith_overrides(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with LangSmith's defaults and no tracing, and leaves them so."""
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
        monkeypatch.delenv(name, raising=False)
    langsmith.set_runtime_overrides()
    yield
    langsmith.set_runtime_overrides()


def _hops(agent: Any, calls: int) -> int:
    """Executor submissions of one ``ainvoke`` of ``agent`` (``calls`` echo calls)."""

    async def go() -> int:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        state = await agent.ainvoke({"messages": [HumanMessage("go")]})
        assert len([m for m in state["messages"] if isinstance(m, ToolMessage)]) == calls
        return executor.submitted

    return asyncio.run(go())


def _script(calls: int) -> list[Any]:
    return [
        tool_calls_message([("echo", {"text": f"t{i}"}) for i in range(calls)]),
        AIMessage(content="done"),
    ]


def test_given_an_untraced_async_run_then_the_middlewares_hooks_hop_to_no_thread(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher],
) -> None:
    """Given an async agent run with toolfleet's middleware and no LangSmith tracing,
    when it makes three calls, then the loop's executor is used no more than by the same
    agent without the middleware (its tools run in process): LangSmith's wrapper of the
    middleware's hooks sets up and ends its untraced runs on the loop."""
    calls = 3
    middleware = CeleryToolMiddleware(dispatcher=dispatchers([echo]))
    remote = create_agent(ScriptedChatModel(script=_script(calls)), [echo], middleware=[middleware])
    local = create_agent(ScriptedChatModel(script=_script(calls)), [echo])
    assert _hops(remote, calls) <= _hops(local, calls)


async def _default(ctx: contextvars.Context, func: Any, /, *args: Any, **kwargs: Any) -> Any:
    """LangSmith's default step: in the loop's executor, inside ``ctx``."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: ctx.run(func, *args, **kwargs))


async def _where(ctx: contextvars.Context) -> str:
    """The thread the override in place runs a step in, inside ``ctx``."""
    override = current_aio_to_thread()
    assert override is not None
    return str(await override(_default, ctx, lambda: threading.current_thread().name))


def test_given_a_traced_context_then_its_steps_still_go_to_the_default_executor() -> None:
    """Given the override installed, when a step's context is traced, then it runs in an
    executor thread as LangSmith's default does; untraced, it runs on the loop's thread."""
    untraced_steps_inline()

    async def go() -> tuple[str, str, str]:
        loop_thread = threading.current_thread().name
        untraced = await _where(contextvars.copy_context())
        with langsmith.tracing_context(enabled=True):
            traced = await _where(contextvars.copy_context())
        return loop_thread, untraced, traced

    loop_thread, untraced, traced = asyncio.run(go())
    assert untraced == loop_thread
    assert traced != loop_thread


def test_given_a_users_override_then_traced_steps_go_to_it_and_one_wrapper_is_kept() -> None:
    """Given an override the user installed first (a constrained runtime's), when the
    middleware's is installed (twice), then a traced step goes through the user's, and
    the override in place wraps the user's once."""
    seen: list[str] = []

    async def users(default: Any, ctx: Any, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        seen.append("users")
        return ctx.run(func, *args, **kwargs)

    langsmith.set_runtime_overrides(aio_to_thread=users)
    untraced_steps_inline()
    installed = current_aio_to_thread()
    untraced_steps_inline()
    assert current_aio_to_thread() is installed

    async def go() -> None:
        with langsmith.tracing_context(enabled=True):
            await _where(contextvars.copy_context())
        await _where(contextvars.copy_context())

    asyncio.run(go())
    assert seen == ["users"]
