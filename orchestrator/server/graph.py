"""The agent the service runs: built from settings, rebuilt when the fleet's tools change.

Tools are bound from the registry the workers publish. A worker that starts after the
service (or one that serves new tools) must not need a restart of the orchestrator, so
before each run the provider compares the served tools with those the current graph was
built with, and rebuilds it (``create_agent`` is cheap) when they differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.base import BaseCheckpointSaver

from orchestrator.agent import build_agent, chat_model
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.scripted import SCRIPTED
from orchestrator.server.graphs import STARTED, assistant_id_for
from orchestrator.tools import RemoteTool
from tool_workers.contract.models import ToolSpec
from tool_workers.contract.settings import Settings

GRAPH_ID = "agent"
"""Graph id of the built-in agent, served when no project file is given."""

ASSISTANT_ID = assistant_id_for(GRAPH_ID)
"""Stable assistant id of that agent: the same on every replica (and LangGraph's server)."""


def resolve_model(spec: str | None) -> BaseChatModel:
    """The chat model a ``TOOLFLEET_MODEL`` value names.

    See :func:`orchestrator.agent.chat_model` for the forms a spec takes.
    """
    return chat_model(spec)


class AgentProvider:
    """The compiled agent, rebuilt when the served tools change.

    Args:
        settings: Settings the agent is built from.
        model: Its chat model.
        checkpointer: The shared LangGraph checkpointer.
        dispatcher: The process's dispatcher (whose registry view lists the served tools).
    """

    def __init__(
        self,
        settings: Settings,
        model: BaseChatModel,
        checkpointer: BaseCheckpointSaver[Any],
        dispatcher: CeleryDispatcher,
    ) -> None:
        self._settings = settings
        self._model = model
        self._checkpointer = checkpointer
        self._dispatcher = dispatcher
        self._served: Mapping[str, ToolSpec] | None = None
        self._graph: Any = None
        self._lock = asyncio.Lock()

    graph_id = GRAPH_ID

    def assistant(self) -> dict[str, Any]:
        """The protocol's ``Assistant`` for the agent."""
        return {
            "assistant_id": ASSISTANT_ID,
            "graph_id": GRAPH_ID,
            "config": {},
            "context": {},
            "metadata": {"created_by": "system", "model": self._settings.model or SCRIPTED},
            "name": GRAPH_ID,
            "description": "create_agent whose tool calls run on the toolfleet workers",
            "version": 1,
            "created_at": STARTED,
            "updated_at": STARTED,
        }

    async def for_run(self, config: dict[str, Any]) -> Any:
        """The agent bound to the tools served now (the same for every run's config)."""
        return await self.get()

    async def for_thread(self, thread_id: str) -> Any:
        """The agent as last built: reading state does not depend on the tools."""
        return self.current()

    async def get(self) -> Any:
        """The agent bound to the tools served now."""
        # The registry read is a blocking Redis SCAN at most once a second: not on the loop.
        served = await asyncio.to_thread(self._dispatcher.served_tools)
        if self._graph is not None and served == self._served:
            return self._graph
        async with self._lock:
            if self._graph is None or served != self._served:
                self._graph = await asyncio.to_thread(self._build, served)
                self._served = served
        return self._graph

    def current(self) -> Any:
        """The agent as last built (for reading state: the tools do not matter there)."""
        if self._graph is None:
            self._graph = self._build({})
            self._served = {}
        return self._graph

    def _build(self, served: Mapping[str, ToolSpec]) -> Any:
        tools = [RemoteTool.from_spec(served[name], self._dispatcher) for name in sorted(served)]
        return build_agent(
            self._settings,
            model=self._model,
            tools=tools,
            dispatcher=self._dispatcher,
            checkpointer=self._checkpointer,
        )
