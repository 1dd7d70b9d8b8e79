"""``toolfleet serve``: the orchestrator as an HTTP service speaking LangGraph's Agent Protocol.

Applications and chat UIs use ``langgraph_sdk.get_client(url=...)`` (or ``RemoteGraph``)
against it unchanged: assistants, threads, runs (background, streamed, waited for,
joined, cancelled). Each run is ``graph.astream`` of the ``create_agent`` agent in an
asyncio task; its tool calls fan out to the Celery workers::

    client -HTTP-> replica A: graph.astream --XADD--> Redis stream run-events:<id>
                        | tool calls                               | XREAD
                        v                                          v
                  Celery workers         client <-SSE- replica B (or A)

Several replicas share Redis (run and thread records, event logs, cancel channel) and
the Postgres checkpointer, so a run started on one can be streamed, joined or cancelled
through any other.
"""

from __future__ import annotations

from orchestrator.server.app import create_app

__all__ = ["create_app"]
