"""A thread created with its history: ``supersteps`` of ``POST /threads``.

As LangGraph's server does, each superstep's updates are applied together by the graph
the thread's metadata names (``graph_id``), with its ``abulk_update_state``: one
checkpoint per superstep, each update written as node ``as_node`` had returned its
values (or as a command). The history is all or nothing: a superstep the graph refuses
(an unknown node, say) leaves no thread behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from langgraph.errors import InvalidUpdateError
from langgraph.types import Command, StateUpdate

from orchestrator.server.encoding import dumps
from orchestrator.server.errors import RequestRefused, Unsupported
from orchestrator.server.graphs import GraphSource
from orchestrator.server.guards.account import size_of, state_field
from orchestrator.server.records import ThreadRecord
from orchestrator.server.runconfig import thread_config
from orchestrator.server.schemas import Superstep
from orchestrator.server.services import Services


def history_graph(svc: Services, metadata: dict[str, Any]) -> GraphSource:
    """The graph that writes a new thread's supersteps: its metadata's ``graph_id``.

    Raises:
        RequestRefused: the metadata names no graph of this server (400, as an edit of
            the state of a thread without a graph is).
    """
    graph_id = metadata.get("graph_id")
    source = svc.graphs.find(str(graph_id)) if graph_id else None
    if source is None:
        raise RequestRefused(
            "supersteps need the graph that applies them: set metadata.graph_id to a graph "
            "of this server"
        )
    return source


async def write_history(
    svc: Services, source: GraphSource, record: ThreadRecord, supersteps: Sequence[Superstep]
) -> None:
    """Apply ``supersteps`` to the new thread ``record``, one checkpoint each.

    Raises:
        Unsupported: the graph refuses an update (422 naming ``supersteps``).
        QuotaExceeded: the values would take the tenant past its storage quota.
    """
    if svc.store.quota is not None:  # state written through the API counts, as edits do
        size = size_of(dumps([s.model_dump(mode="json") for s in supersteps]))
        await svc.store.quota.charge(record.tenant, state_field(record.thread_id), size, add=True)
    config = thread_config(record.key)
    config["configurable"].update(checkpoint_ns="", graph_id=source.graph_id)
    graph = await source.for_thread(record.key)
    steps = [
        [
            StateUpdate(
                # A command, or values (a list of (channel, value) pairs is taken too).
                cast(Any, Command(**u.command.model_dump(exclude_none=True)))
                if u.command
                else cast(Any, u.values),
                u.as_node,
            )
            for u in superstep.updates
        ]
        for superstep in supersteps
    ]
    try:
        await graph.abulk_update_state(config, steps)
    except (InvalidUpdateError, ValueError, KeyError) as exc:
        raise Unsupported(f"supersteps: {exc}") from None
    snapshot = await graph.aget_state(thread_config(record.key))
    await svc.store.set_thread_status(record.key, "interrupted" if snapshot.next else "idle")
