"""Schema-only tools built from the registry: bind and call tools whose code is elsewhere."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Literal

from celery import Celery
from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.tools import BaseTool, ToolException
from pydantic import ConfigDict, Field

from orchestrator.call import PreparedCall
from orchestrator.dispatch.base import Dispatcher
from orchestrator.dispatch.fleet import dispatcher_for
from orchestrator.tracing import dispatch_span, trace_context
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings


class RemoteTool(BaseTool):
    """A tool that exists on the workers; here only its name, description and schema.

    Bound to a model like any tool. Under :class:`~orchestrator.CeleryToolMiddleware` or
    :class:`~orchestrator.RemoteToolNode` its calls never reach this object; invoked
    directly, it dispatches the call to the workers itself.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: ToolSpec
    dispatcher: Any = Field(default=None, exclude=True)
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: bool = True

    @classmethod
    def from_spec(cls, spec: ToolSpec, dispatcher: Dispatcher | None = None) -> RemoteTool:
        """A remote tool for a registry spec."""
        return cls(
            name=spec.name,
            description=spec.description or spec.name,
            args_schema=spec.parameters or {"type": "object", "properties": {}},
            return_direct=spec.return_direct,
            spec=spec,
            dispatcher=dispatcher,
        )

    def _call(self, kwargs: dict[str, Any]) -> PreparedCall:
        call_id = f"direct-{uuid.uuid4().hex}"
        return PreparedCall(
            tool=self.name,
            call_id=call_id,
            args=kwargs,
            task_id=task_id_for(call_id),
            queue=self.spec.queue,
            spec=self.spec,
        )

    def _run(
        self, *args: Any, run_manager: CallbackManagerForToolRun | None = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        dispatcher = self.dispatcher or dispatcher_for()
        call = self._call(kwargs)
        with dispatch_span(call) as span:
            result = dispatcher.wait(_traced(call, run_manager))
            span.finished_with(result)
        return _unpack(result)

    async def _arun(
        self, *args: Any, run_manager: AsyncCallbackManagerForToolRun | None = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        dispatcher = self.dispatcher or dispatcher_for()
        call = self._call(kwargs)
        with dispatch_span(call) as span:
            result = await dispatcher.wait_async(_traced(call, run_manager))
            span.finished_with(result)
        return _unpack(result)


def _traced(
    call: PreparedCall,
    run_manager: CallbackManagerForToolRun | AsyncCallbackManagerForToolRun | None,
) -> PreparedCall:
    """The call with the trace context of this tool run and the current span."""
    if run_manager is None:
        return replace(call, trace=trace_context(None, []))
    return replace(call, trace=trace_context(run_manager.run_id, run_manager.handlers))


def _unpack(result: ToolResult) -> tuple[Any, Any]:
    if result.status == "error":
        raise ToolException(result.content)
    return result.content, result.artifact


def discover_tools(
    app: Celery | None = None,
    *,
    settings: Settings | None = None,
    dispatcher: Dispatcher | None = None,
    require: Iterable[str] = (),
    wait: float = 0.0,
) -> list[BaseTool]:
    """Schema-only tools for everything the live workers serve.

    Passed as ``create_agent``'s ``tools=``, a tool here replaces any middleware's tool of
    the same name (LangChain's rule, silent); with middleware that brings tools, use
    ``CeleryToolMiddleware(discover=True)`` instead (:mod:`orchestrator.offering`).

    Args:
        app: The Celery app (built from settings if omitted).
        settings: Settings to read the registry with.
        dispatcher: Dispatcher the tools use when invoked directly.
        require: Tool names to wait for (``wait`` seconds at most).
        wait: Seconds to wait for ``require`` (or for any tool when ``require`` is empty).

    Returns:
        One :class:`RemoteTool` per served tool, sorted by name.
    """
    dispatcher = dispatcher or dispatcher_for(app, settings)
    wanted = set(require)
    deadline = time.monotonic() + wait
    served = dispatcher.served_tools()
    while not (wanted <= served.keys() if wanted else served) and time.monotonic() < deadline:
        time.sleep(0.2)
        served = dispatcher.served_tools(fresh=True)
    return [RemoteTool.from_spec(served[name], dispatcher) for name in sorted(served)]
