"""The graphs one server runs, each served as an assistant of the Agent Protocol.

Without a project file that is the built-in agent (graph id ``agent``, see
:mod:`orchestrator.server.graph`); with one (``toolfleet serve --config``), the project's
graphs (:mod:`orchestrator.server.projects`). As LangGraph's server does, the server
supplies the persistence: a project's graph runs with the server's checkpointer whatever
it was compiled with, so its threads are durable and shared by the replicas, and with
the server's store: the one ``TOOLFLEET_STORE_URL`` names (the one remote tools reach),
else one in memory, as ``langgraph dev`` gives (the store API serves the same one).

Assistant ids derive from graph ids as LangGraph's server derives them (a UUID5 in its
namespace), so an id a client stored stays valid across restarts, on every replica, and
on either server.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.store.base import BaseStore

from orchestrator.server.errors import NotFound
from orchestrator.server.projects import ProjectGraph
from tool_workers.contract.errors import ConfigError

NAMESPACE_GRAPH = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
"""The UUID namespace LangGraph's server derives a graph's assistant id in."""

STARTED = datetime.now(UTC).isoformat()
"""When this process started: the creation time of the assistants it serves."""


def assistant_id_for(graph_id: str) -> str:
    """The stable assistant id of a graph, as LangGraph's server derives it."""
    return str(uuid.uuid5(NAMESPACE_GRAPH, graph_id))


class GraphSource(Protocol):
    """One graph of the server: its assistant, and the compiled graph for a run."""

    @property
    def graph_id(self) -> str:
        """The graph's id."""
        ...

    def assistant(self) -> dict[str, Any]:
        """The protocol's ``Assistant`` for the graph."""
        ...

    async def for_run(self, config: dict[str, Any]) -> Any:
        """The compiled graph (with the server's checkpointer) a run with ``config`` runs."""
        ...

    async def for_thread(self, thread_id: str) -> Any:
        """The compiled graph that reads a thread's state and history."""
        ...


class ProjectSource:
    """A graph of a project file, with the server's checkpointer.

    Args:
        graph: The imported graph (or the function that makes it).
        checkpointer: The server's checkpointer; it replaces the graph's own.
        store: The server's store, replacing the graph's own (``None``: the graph keeps
            the store it was compiled with, if any).
    """

    def __init__(
        self,
        graph: ProjectGraph,
        checkpointer: BaseCheckpointSaver[Any],
        store: BaseStore | None = None,
    ) -> None:
        self._graph = graph
        self._checkpointer = checkpointer
        self._store = store
        self._compiled = None if graph.is_factory else self._attach(graph.value)

    @property
    def graph_id(self) -> str:
        """The graph's id in the project file."""
        return self._graph.spec.graph_id

    def assistant(self) -> dict[str, Any]:
        """The protocol's ``Assistant``; named as the graph is, else by its graph id."""
        name = self._compiled.name if self._compiled is not None else self.graph_id
        return {
            "assistant_id": assistant_id_for(self.graph_id),
            "graph_id": self.graph_id,
            "config": {},
            "context": {},
            "metadata": {"created_by": "system"},
            "name": name,
            "description": self._graph.spec.description,
            "version": 1,
            "created_at": STARTED,
            "updated_at": STARTED,
        }

    async def for_run(self, config: dict[str, Any]) -> Any:
        """The graph; a factory is called for each run (with ``config`` if it takes one)."""
        if self._compiled is not None:
            return self._compiled
        factory = self._graph.value
        args = (config,) if self._graph.takes_config else ()
        if inspect.iscoroutinefunction(factory):
            made = await factory(*args)
        else:
            # A factory may build an agent or read the registry: blocking work, off the loop.
            made = await asyncio.to_thread(factory, *args)
            if inspect.isawaitable(made):
                made = await made
        return self._attach(made)

    async def for_thread(self, thread_id: str) -> Any:
        """The graph, made (if made per run) with the config of reading the thread."""
        return await self.for_run({"configurable": {"thread_id": thread_id}})

    def _attach(self, graph: Any) -> Any:
        if isinstance(graph, StateGraph):
            graph = graph.compile()
        if not isinstance(graph, Pregel):
            raise ConfigError(
                f"graph {self.graph_id!r}: {self._graph.spec.target!r} made a "
                f"{type(graph).__name__}, not a graph"
            )
        update: dict[str, Any] = {"checkpointer": self._checkpointer}
        if self._store is not None:
            update["store"] = self._store
        if graph.name == "LangGraph":  # the default: the graph id says more
            update["name"] = self.graph_id
        return graph.copy(update=update)


class Graphs:
    """The assistants of one server, found by assistant id or graph id.

    Args:
        sources: The graphs, the first being the default (for threads no run has tagged).
    """

    def __init__(self, sources: Sequence[GraphSource]) -> None:
        if not sources:
            raise ConfigError("a server needs at least one graph")
        self.default = sources[0]
        self._by_id: dict[str, GraphSource] = {}
        for source in sources:
            self._by_id[source.graph_id] = source
            self._by_id[assistant_id_for(source.graph_id)] = source
        self.sources = tuple(sources)

    def find(self, assistant_id: str) -> GraphSource | None:
        """The graph an assistant id (or a graph id) names, if any."""
        return self._by_id.get(assistant_id)

    def get(self, assistant_id: str) -> GraphSource:
        """The graph an assistant id (or a graph id) names.

        Raises:
            NotFound: it names none.
        """
        found = self.find(assistant_id)
        if found is None:
            served = ", ".join(repr(s.graph_id) for s in self.sources)
            raise NotFound(f"assistant {assistant_id!r} not found (this server runs {served})")
        return found

    def assistants(self) -> list[dict[str, Any]]:
        """Every assistant, in the order of the graphs."""
        return [source.assistant() for source in self.sources]

    async def for_thread(self, thread_id: str, metadata: Mapping[str, Any]) -> Any:
        """The graph that reads a thread: the one its runs ran (by its metadata's
        ``graph_id``), else the default."""
        source = self.find(str(metadata.get("graph_id", ""))) or self.default
        return await source.for_thread(thread_id)
