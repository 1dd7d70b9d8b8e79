"""Build the orchestrator's agent and its checkpointer from settings."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver

from orchestrator.dispatch.base import Dispatcher
from orchestrator.dispatch.fleet import dispatcher_for
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.sample import scripted_model
from orchestrator.scripted import SCRIPTED
from orchestrator.tools import discover_tools
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.process import private_sqlite
from tool_workers.contract.settings import Settings


def chat_model(spec: str | None) -> BaseChatModel:
    """The chat model a model spec (``TOOLFLEET_MODEL``, ``--model``) names.

    * ``None`` or ``toolfleet:scripted``: the deterministic scripted demo model;
    * ``package.module:attribute``, or ``module:attribute`` of a module on the import path
      or in the current directory: that attribute, a chat model or a function returning
      one (how tests and custom deployments plug a model in);
    * anything else, ``provider:name``: ``init_chat_model`` (e.g. ``openai:gpt-4o-mini``).

    Raises:
        ConfigError: the import path does not lead to a chat model, or the spec names
            neither an importable attribute nor a model ``init_chat_model`` can build.
    """
    if spec is None or spec == SCRIPTED:
        return scripted_model()
    module_name, sep, attribute = spec.partition(":")
    if sep and "." in module_name:  # provider names never contain a dot
        target = _import_attribute(spec, module_name, attribute)
    else:
        # "module:attribute" or "provider:name": the same form. A module of that name
        # with that attribute wins; anything else is for init_chat_model.
        target = _find_attribute(module_name, attribute) if sep else None
        if target is None:
            return _init_chat_model(spec)
    model = target() if callable(target) and not isinstance(target, BaseChatModel) else target
    if not isinstance(model, BaseChatModel):
        raise ConfigError(f"model {spec!r} is not a chat model: {type(model)!r}")
    return model


def _import_attribute(spec: str, module_name: str, attribute: str) -> Any:
    _with_current_directory()
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"model {spec!r}: cannot import it ({exc})") from exc


def _find_attribute(module_name: str, attribute: str) -> Any:
    """The module's attribute; ``None`` when there is no such module or attribute."""
    if not module_name.isidentifier():
        return None
    _with_current_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:  # the module exists; something it imports does not
            raise ConfigError(f"model module {module_name!r}: cannot import it ({exc})") from exc
        return None
    return getattr(module, attribute, None)


def _with_current_directory() -> None:
    # The console script's import path starts at its own folder, not the working
    # directory, where a deployment's model module usually is (as with `python -m`).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _init_chat_model(spec: str) -> BaseChatModel:
    from langchain.chat_models import init_chat_model

    try:
        return init_chat_model(spec)
    except (ValueError, ImportError) as exc:
        raise ConfigError(
            f"model {spec!r}: not module:attribute of a module on the import path or in "
            f"the current directory, and init_chat_model cannot build it ({exc})"
        ) from exc


def _pool_options(settings: Settings) -> dict[str, Any]:
    """The Postgres pool of either saver: ``database_pool_size`` connections of
    ``database_url``, as langgraph's Postgres savers expect them (autocommit, no
    prepared statements, rows as dicts)."""
    from psycopg.rows import dict_row

    return {
        "conninfo": settings.database_url,
        "max_size": settings.database_pool_size,
        "kwargs": {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    }


@contextmanager
def checkpointer(settings: Settings) -> Iterator[BaseCheckpointSaver[Any]]:
    """A sync checkpointer: Postgres when ``database_url`` is set, else the SQLite file.

    Postgres connections come from a pool of ``database_pool_size``, so concurrent runs
    do not queue behind one connection.
    """
    if settings.database_url:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import DictRow
        from psycopg_pool import ConnectionPool

        pool: ConnectionPool[Connection[DictRow]] = ConnectionPool(
            **_pool_options(settings), open=True
        )
        with pool:
            saver = PostgresSaver(pool)
            saver.setup()
            yield saver
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    private_sqlite(Path(settings.checkpoint_path))  # other users' snippets must not read it
    with SqliteSaver.from_conn_string(str(settings.checkpoint_path)) as sqlite_saver:
        yield sqlite_saver


@asynccontextmanager
async def async_checkpointer(settings: Settings) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """An asyncio checkpointer: Postgres (pooled) when ``database_url`` is set, else SQLite."""
    if settings.database_url:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg import AsyncConnection
        from psycopg.rows import DictRow
        from psycopg_pool import AsyncConnectionPool

        pool: AsyncConnectionPool[AsyncConnection[DictRow]] = AsyncConnectionPool(
            **_pool_options(settings), open=False
        )
        await pool.open()
        try:
            saver = AsyncPostgresSaver(pool)
            await saver.setup()
            yield saver
        finally:
            await pool.close()
        return
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    # Other users' snippets must not read it (file system calls: off the event loop).
    await asyncio.to_thread(private_sqlite, Path(settings.checkpoint_path))
    async with AsyncSqliteSaver.from_conn_string(str(settings.checkpoint_path)) as sqlite_saver:
        yield sqlite_saver


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
