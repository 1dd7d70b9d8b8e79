"""Build the orchestrator's agent and its checkpointer from settings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver

from orchestrator.discovery import discover_tools
from orchestrator.dispatch import Dispatcher
from orchestrator.middleware import CeleryToolMiddleware
from tool_workers.settings import Settings


def chat_model(spec: str | None) -> BaseChatModel:
    """The chat model ``provider:name`` names, or the scripted demo model for ``None``."""
    if spec is None:
        from orchestrator.demo import scripted_model

        return scripted_model()
    from langchain.chat_models import init_chat_model

    return init_chat_model(spec)


@contextmanager
def checkpointer(settings: Settings) -> Iterator[BaseCheckpointSaver[Any]]:
    """A sync checkpointer: Postgres when ``database_url`` is set, else the SQLite file."""
    if settings.database_url:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(settings.database_url) as saver:
            saver.setup()
            yield saver
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(settings.checkpoint_path)) as saver:
        yield saver


@asynccontextmanager
async def async_checkpointer(settings: Settings) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """An asyncio checkpointer: Postgres when ``database_url`` is set, else SQLite."""
    if settings.database_url:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(settings.database_url) as saver:
            await saver.setup()
            yield saver
        return
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(settings.checkpoint_path)) as saver:
        yield saver


def build_agent(
    settings: Settings,
    *,
    model: BaseChatModel | None = None,
    tools: Sequence[BaseTool] | None = None,
    dispatcher: Dispatcher | None = None,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    middleware: Sequence[AgentMiddleware[Any, Any]] = (),
    system_prompt: str | None = None,
    wait_for_tools: float = 0.0,
) -> Any:
    """``create_agent`` with the tool calls going to the fleet ``settings`` describe.

    Args:
        settings: Broker, model spec and checkpointer settings.
        model: The chat model (default: ``settings.model``, or the scripted one).
        tools: Tools to bind (default: discovered from the registry).
        dispatcher: Dispatcher of the fleet (default: the process-wide one for settings).
        checkpointer: LangGraph checkpointer for durable, resumable runs.
        middleware: More middleware, placed before (outside) the toolfleet one.
        system_prompt: System prompt of the agent.
        wait_for_tools: Seconds to wait for workers when discovering tools.
    """
    from orchestrator.fleet import dispatcher_for

    dispatcher = dispatcher or dispatcher_for(settings=settings)
    if tools is None:
        tools = discover_tools(dispatcher=dispatcher, wait=wait_for_tools)
    return create_agent(
        model or chat_model(settings.model),
        list(tools),
        system_prompt=system_prompt,
        middleware=[*middleware, CeleryToolMiddleware(dispatcher=dispatcher)],
        checkpointer=checkpointer,
    )
