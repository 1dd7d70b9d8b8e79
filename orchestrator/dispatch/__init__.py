"""The transport: how prepared calls reach the workers and their results come back.

::

    base.py        Dispatcher, the complete interface the agent side uses
    transport.py   TransportDispatcher: watch, wait, read, cancel; a transport under it
    dispatcher.py  CeleryDispatcher: Celery tasks out, results back on a reply channel
    envelope.py    a call's task message, as Celery's own client would publish it
    publish.py     Publisher: each call published at most once, batched, sync or async
    waiting.py     Waiting: the decisions of a wait for a result, sync and async
    listener.py    ResultListener: one pub/sub connection, futures per call
    watch.py       WatchTable: what the listener keeps per watched call
    outcome.py     result_from_meta: a Celery meta as a ToolResult
    registry.py    RegistryView: the tools the live workers serve
    loop_redis.py  LoopClients: a redis.asyncio client per event loop
    timings.py     CallTimings: dispatch-to-start and result wait, per tool
    fleet.py       dispatcher_for: one dispatcher per process and deployment
    in_process.py  InProcessDispatcher: a transport running the worker's code in threads
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.dispatch.base import Dispatcher, PlacementTable
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.dispatch.fleet import close_all, dispatcher_for

if TYPE_CHECKING:
    from orchestrator.dispatch.in_process import InProcessDispatcher

__all__ = [
    "CeleryDispatcher",
    "Dispatcher",
    "InProcessDispatcher",
    "PlacementTable",
    "close_all",
    "dispatcher_for",
]


def __getattr__(name: str) -> Any:
    # The in-process dispatcher runs the worker's runtime in this process: it is loaded
    # when it is asked for, so importing the transport loads no worker code.
    if name == "InProcessDispatcher":
        from orchestrator.dispatch.in_process import InProcessDispatcher

        return InProcessDispatcher
    raise AttributeError(f"module 'orchestrator.dispatch' has no attribute {name!r}")
