"""LangSmith on the worker: a tool's body runs as the orchestrator's tool run.

The orchestrator's callbacks post the tool run of a remote call (its LangSmith tracer
sees ``on_tool_start``/``on_tool_end`` there) and send that run's ``langsmith-trace``
and ``baggage`` with the call. With tracing enabled on the worker too (the standard
``LANGSMITH_*`` environment), the worker must add what the tool traces (a nested LLM
call, a ``@traceable`` step, a runnable) under that run, and must not post a second
tool run for the same execution.

LangChain's own pieces do it, with one run id shared by both sides:

- the tool is invoked with ``run_id`` set to the orchestrator's tool run id, and with a
  callback manager holding one :class:`_InsideToolTracer`: a ``LangChainTracer`` that
  knows that run (``RunTree.from_headers``: its trace id, dotted order and project) and
  leaves the tool-level events of that one id to the orchestrator;
- ``BaseTool.run`` hands the tool's body a child callback manager whose parent is that
  run id, so LangChain runs inside nest under it in the tracer's order map, and
  ``@traceable`` finds it through ``RunTree.from_runnable_config``, sync and async.

Without a ``langsmith-trace`` in the request, or with tracing off on the worker, the tool
is invoked as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from langchain_core.callbacks import CallbackManager
from langchain_core.runnables import RunnableConfig
from langchain_core.tracers.langchain import LangChainTracer
from langsmith import RunTree
from langsmith import utils as ls_utils

from tool_workers.contract.models import TraceContext

log = logging.getLogger("toolfleet.worker")


class _InsideToolTracer(LangChainTracer):
    """Posts what runs inside one remote tool run (``tool_run``), never that run itself."""

    def __init__(self, *args: Any, tool_run: UUID | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tool_run = tool_run

    @classmethod
    def inside(cls, parent: RunTree) -> _InsideToolTracer:
        """A tracer for the body of the tool run ``parent`` (from the call's headers)."""
        tracer = cls(project_name=parent.session_name, tool_run=parent.id)
        # Known, so children nest under it; not one of this tracer's own runs, so it
        # is neither posted nor dropped from the map when a child ends.
        tracer.run_map[str(parent.id)] = parent
        tracer.order_map[parent.id] = (parent.trace_id, parent.dotted_order)
        return tracer

    def copy_with_metadata_defaults(
        self, *, metadata: Mapping[str, str] | None = None, tags: list[str] | None = None
    ) -> LangChainTracer:
        # A nested run's copy (with the model's metadata) shares the maps; it keeps
        # leaving the tool run to the orchestrator too.
        copy = super().copy_with_metadata_defaults(metadata=metadata, tags=tags)
        if isinstance(copy, _InsideToolTracer):
            copy._tool_run = self._tool_run
        return copy

    def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kwargs: Any
    ) -> RunTree:
        if run_id == self._tool_run:
            return self.run_map[str(run_id)]
        return super().on_tool_start(serialized, input_str, run_id=run_id, **kwargs)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> RunTree:
        if run_id == self._tool_run:
            return self.run_map[str(run_id)]
        return super().on_tool_end(output, run_id=run_id, **kwargs)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> RunTree:
        if run_id == self._tool_run:
            return self.run_map[str(run_id)]
        return super().on_tool_error(error, run_id=run_id, **kwargs)


def parented_config(config: RunnableConfig, trace: TraceContext | None) -> RunnableConfig:
    """``config`` to invoke the tool with so it runs as the caller's LangSmith tool run.

    Returns ``config`` itself when the call carries no LangSmith context or tracing is
    off here.
    """
    if trace is None or not trace.langsmith_trace or not ls_utils.tracing_is_enabled():
        return config
    headers: dict[str | bytes, str | bytes] = dict(trace.headers().items())
    try:
        parent = RunTree.from_headers(headers)
    except Exception:  # tracing never fails a call: a malformed parent is ignored
        log.warning("ignored a malformed langsmith-trace header")
        return config
    if parent is None:
        return config
    tracer = _InsideToolTracer.inside(parent)
    manager = CallbackManager(handlers=[tracer], inheritable_handlers=[tracer])
    return {**config, "callbacks": manager, "run_id": parent.id}
