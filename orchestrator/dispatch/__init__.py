"""The transport: how prepared calls reach the workers and their results come back.

::

    base.py        Dispatcher, the complete interface the agent side uses
    celery.py      CeleryDispatcher: Celery tasks out, the result backend's pub/sub in
    publish.py     Publisher: claim (SET NX) and publish each call at most once
    listener.py    ResultListener: one pub/sub connection per process, futures per call
    watch.py       WatchTable: what the listener keeps per watched call
    outcome.py     result_from_meta: a Celery meta as a ToolResult
    registry.py    RegistryView: the tools the live workers serve
    fleet.py       dispatcher_for: one dispatcher per process and deployment
    in_process.py  InProcessDispatcher: the worker's code in threads, for fast tests
"""

from __future__ import annotations

from orchestrator.dispatch.base import Dispatcher, PlacementTable
from orchestrator.dispatch.celery import CeleryDispatcher
from orchestrator.dispatch.fleet import close_all, dispatcher_for
from orchestrator.dispatch.in_process import InProcessDispatcher

__all__ = [
    "CeleryDispatcher",
    "Dispatcher",
    "InProcessDispatcher",
    "PlacementTable",
    "close_all",
    "dispatcher_for",
]
