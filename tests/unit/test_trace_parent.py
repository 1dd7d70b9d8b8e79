"""The worker's LangSmith parent: only a well-formed caller's run changes the config."""

from __future__ import annotations

import pytest
from langchain_core.runnables import RunnableConfig
from langsmith.run_helpers import tracing_context

from tool_workers.contract.models import TraceContext
from tool_workers.observability.trace_parent import parented_config

CONFIG: RunnableConfig = {"configurable": {"thread_id": "t-1"}, "tags": ["a"]}


@pytest.mark.parametrize(
    "trace",
    [
        None,
        TraceContext(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        TraceContext(langsmith_trace="not-a-dotted-order"),
        TraceContext(langsmith_trace="20240101T000000000000Znot-a-uuid"),
    ],
)
def test_given_no_usable_langsmith_parent_then_the_config_is_left_as_it_is(
    trace: TraceContext | None,
) -> None:
    """Given tracing on, when a call carries no LangSmith context (or a malformed one),
    then the tool is invoked with its config unchanged (traced as before, never failed)."""
    with tracing_context(enabled=True):
        assert parented_config(CONFIG, trace) is CONFIG


def test_given_tracing_off_on_the_worker_then_a_parent_is_not_used() -> None:
    """Given tracing off here, when a call carries its caller's run, then nothing changes."""
    trace = TraceContext(
        langsmith_trace="20240101T000000000000Z0f0c2a6e-56a3-4b31-8a5f-0b7b8c8f6a11"
    )
    with tracing_context(enabled=False):
        assert parented_config(CONFIG, trace) is CONFIG
