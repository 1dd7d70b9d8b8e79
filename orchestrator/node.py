"""``RemoteToolNode``: langgraph's ToolNode whose calls run on the tool workers."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode

from orchestrator.dispatch.base import Dispatcher
from orchestrator.middleware import CeleryToolMiddleware


class RemoteToolNode(ToolNode):
    """Drop-in for :class:`langgraph.prebuilt.ToolNode` in hand-built graphs.

    Works with ``tools_condition`` (the node receives the state and runs every call of
    the last AIMessage) and with explicit ``Send("tools", [call])`` fan-out.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        app: Celery | None = None,
        *,
        dispatcher: Dispatcher | None = None,
        eager_dispatch: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            tools: The tools the model may call (their code need not be here:
                :func:`~orchestrator.discover_tools` gives schema-only ones).
            app: Celery app to publish with; built from settings if omitted.
            dispatcher: Use this dispatcher instead of one for ``app``.
            eager_dispatch: Deprecated, no effect (see
                :class:`~orchestrator.CeleryToolMiddleware`).
            **kwargs: Passed to ``ToolNode`` (``name``, ``tags``, ``handle_tool_errors``,
                ``messages_key``).
        """
        if eager_dispatch is not None:
            warnings.warn(
                "eager_dispatch has no effect (pass max_concurrency in the run config for "
                "wide sync fan-outs)",
                DeprecationWarning,
                stacklevel=2,
            )
        self.middleware = CeleryToolMiddleware(app, dispatcher=dispatcher)
        super().__init__(
            tools,
            wrap_tool_call=self.middleware.wrap_tool_call,
            awrap_tool_call=self.middleware.awrap_tool_call,
            **kwargs,
        )
