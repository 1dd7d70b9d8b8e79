"""The worker's OpenTelemetry span of a call: in the caller's trace, with its attributes."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celery
import pytest
from celery import Celery
from langchain.agents import create_agent
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from tests.support.fleet import one_turn
from tests.support.spans import describe
from tool_workers.contract.broker import create_app
from tool_workers.contract.models import ToolRequest, TraceContext
from tool_workers.contract.names import task_name
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def send(app: Celery, tool: str, trace: TraceContext | None, **args: Any) -> str:
    """Publish one call as the orchestrator would (with ``trace``); wait for its result."""
    task_id = str(uuid.uuid4())
    request = ToolRequest(
        tool=tool,
        call_id=f"call-{tool}",
        args=args,
        idempotency_key=task_id,
        thread_id="thread-1",
        run_id="run-1",
        trace=trace,
    )
    app.send_task(task_name(tool), args=[request.model_dump(mode="json")], task_id=task_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # A tool error is a failed task (tool_workers.contract.failed).
        if app.backend.get_task_meta(task_id).get("status") in ("SUCCESS", "FAILURE"):
            return task_id
        time.sleep(0.05)
    raise AssertionError(f"no result for {tool}")


def spans_of(path: Path, expected: int) -> list[dict[str, Any]]:
    """The spans the worker's processes have written, once there are ``expected``."""
    deadline = time.monotonic() + 10
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        spans = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        if len(spans) >= expected:
            break
        time.sleep(0.05)
    return spans


def test_worker_span_joins_the_callers_trace_with_the_call_attributes(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    """Given a prefork worker with an OpenTelemetry SDK, when the caller publishes calls
    carrying its span's traceparent, then each call's worker span is that span's child in
    the same trace, names the call (tool, tool_call_id, thread, run, task, worker,
    attempt, outcome) and nothing of its arguments, is the parent of what the tool
    traces, and marks a tool error; a call without a trace context starts its own."""
    spans_file = tmp_path / "spans.jsonl"
    settings = make_settings(tool_modules=("tests.fleet_tools", "tests.otel_worker"))
    worker = start_worker(
        settings, pool="prefork", concurrency=1, extra_env={"TOOLFLEET_TEST_SPANS": str(spans_file)}
    )

    app = create_app(settings)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.orchestrator")
    with tracer.start_as_current_span("dispatch") as dispatch:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        trace = TraceContext.from_headers(carrier)
        assert trace is not None and trace.traceparent
        ok = send(app, "traced_step", trace, label="secret-argument")
        failed = send(app, "boom", trace, reason="r")
    alone = send(app, "traced_step", None, label="alone")
    (caller,) = exporter.get_finished_spans()
    caller_trace = f"{dispatch.get_span_context().trace_id:032x}"
    caller_span = f"{dispatch.get_span_context().span_id:016x}"
    assert caller.name == "dispatch"

    spans = spans_of(spans_file, expected=5)
    by_task = {s["attributes"].get("toolfleet.task_id"): s for s in spans}
    step, error, root = by_task[ok], by_task[failed], by_task[alone]
    assert step["name"] == "execute_tool traced_step" and step["kind"] == "CONSUMER"
    assert step["attributes"] == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "traced_step",
        "gen_ai.tool.call.id": "call-traced_step",
        "toolfleet.tool": "traced_step",
        "toolfleet.tool_call_id": "call-traced_step",
        "toolfleet.thread_id": "thread-1",
        "toolfleet.run_id": "run-1",
        "toolfleet.task_id": ok,
        "toolfleet.worker": worker.hostname,
        "toolfleet.attempt": 1,
        "toolfleet.outcome": "success",
    }
    assert (step["trace_id"], step["parent_id"]) == (caller_trace, caller_span)
    assert step["status"] == "UNSET"
    assert "secret-argument" not in json.dumps(step)

    (inner,) = [s for s in spans if s["name"] == "inner secret-argument"]
    assert (inner["trace_id"], inner["parent_id"]) == (caller_trace, step["span_id"])

    assert (error["trace_id"], error["parent_id"]) == (caller_trace, caller_span)
    assert error["attributes"]["toolfleet.outcome"] == "tool_error"
    assert error["status"] == "ERROR"

    assert root["trace_id"] != caller_trace and root["parent_id"] is None


def test_trace_headers_round_trip_and_a_bad_one_never_fails_a_call() -> None:
    """Given propagation headers, then TraceContext keeps each under its wire name; a
    request whose trace context is malformed is still a valid request, without it."""
    headers = {
        "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=1",
        "langsmith-trace": "20240101T000000000000Z1f0c.20240101T000000000001Z2a1d",
        "baggage": "langsmith-project=agents",
    }
    trace = TraceContext.from_headers(headers)
    assert trace is not None
    assert trace.headers() == {name.lower(): value for name, value in headers.items()}
    assert TraceContext.from_headers({"content-type": "json"}) is None

    raw = {
        "tool": "echo",
        "call_id": "c",
        "idempotency_key": "k",
        "trace": {"traceparent": "not-a-traceparent"},
    }
    assert ToolRequest.model_validate(raw).trace is None


@pytest.fixture
def orchestrator_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider as this process's global one, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", None)
    otel_trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_agents_remote_calls_are_dispatch_spans_parenting_the_worker_spans(
    orchestrator_spans: InMemorySpanExporter,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    mode: str,
) -> None:
    """Given OpenTelemetry's SDK in the orchestrator and on a prefork worker, when an
    agent run inside a span fans out two remote calls, sync or async, then each call
    is a span ``dispatch_tool <tool>`` of that trace (a child of the run's span, with the
    call's attributes and outcome, nothing of its arguments) and the worker's span of
    the call is its child: one trace across both processes."""
    spans_file = tmp_path / "spans.jsonl"
    settings = make_settings(tool_modules=("tests.fleet_tools", "tests.otel_worker"))
    worker = start_worker(
        settings, pool="prefork", concurrency=2, extra_env={"TOOLFLEET_TEST_SPANS": str(spans_file)}
    )
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["traced_step"], wait=10)
    calls = [("traced_step", {"label": "secret-one"}), ("traced_step", {"label": "secret-two"})]
    agent = create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )
    payload = {"messages": [("user", "go")]}

    with otel_trace.get_tracer("tests.agent").start_as_current_span("agent run") as outer:
        state = agent.invoke(payload) if mode == "sync" else asyncio.run(agent.ainvoke(payload))

    assert state["messages"][-1].content == "done: 2 results"
    trace_id = f"{outer.get_span_context().trace_id:032x}"
    outer_id = f"{outer.get_span_context().span_id:016x}"
    dispatches = [
        describe(span)
        for span in orchestrator_spans.get_finished_spans()
        if span.name == "dispatch_tool traced_step"
    ]
    assert len(dispatches) == 2
    for span in dispatches:
        assert (span["trace_id"], span["parent_id"]) == (trace_id, outer_id)
        assert span["kind"] == "PRODUCER" and span["status"] == "UNSET"
        attributes = span["attributes"]
        assert attributes["toolfleet.tool"] == "traced_step"
        assert attributes["toolfleet.outcome"] == "success"
        assert attributes["toolfleet.worker"] == worker.hostname
        assert attributes["toolfleet.attempt"] == 1
        assert {"toolfleet.tool_call_id", "toolfleet.task_id"} <= set(attributes)
        assert "secret" not in json.dumps(span)
    worker_spans = spans_of(spans_file, expected=4)
    for dispatch in dispatches:
        task_id = dispatch["attributes"]["toolfleet.task_id"]
        (executed,) = [
            s for s in worker_spans if s["attributes"].get("toolfleet.task_id") == task_id
        ]
        assert executed["name"] == "execute_tool traced_step"
        assert (executed["trace_id"], executed["parent_id"]) == (trace_id, dispatch["span_id"])
        assert (
            executed["attributes"]["toolfleet.tool_call_id"]
            == (dispatch["attributes"]["toolfleet.tool_call_id"])
        )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_with_celerys_instrumentation_on_both_sides_the_trace_stays_one(
    orchestrator_spans: InMemorySpanExporter,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    mode: str,
) -> None:
    """Given opentelemetry-instrumentation-celery in the orchestrator and on the worker,
    when an agent run inside a span makes a remote call, sync or async, then the chain is
    unbroken and every span exported: the run's span, the dispatch span, the
    instrumentation's publish span, its task span on the worker, toolfleet's
    execute_tool span, all in one trace."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    spans_file = tmp_path / "spans.jsonl"
    settings = make_settings(tool_modules=("tests.fleet_tools", "tests.otel_worker"))
    start_worker(
        settings,
        pool="prefork",
        concurrency=1,
        extra_env={"TOOLFLEET_TEST_SPANS": str(spans_file), "TOOLFLEET_TEST_CELERY_OTEL": "1"},
    )
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["traced_step"], wait=10)
    agent = create_agent(
        one_turn([("traced_step", {"label": "x"})]),
        tools,
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )
    payload = {"messages": [("user", "go")]}
    # The instrumentation looks each published task up in Celery's default app, whose first
    # use loads its configuration from the working directory (os.getcwd: a blocking call
    # where an async run publishes). A process that used Celery before has loaded it; this
    # test may run first in its process, so it loads it here, outside the event loop.
    celery.current_app.tasks  # noqa: B018
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=otel_trace.get_tracer_provider())
    try:
        with otel_trace.get_tracer("tests.agent").start_as_current_span("agent run") as outer:
            if mode == "sync":
                agent.invoke(payload)
            else:
                asyncio.run(agent.ainvoke(payload))
    finally:
        instrumentor.uninstrument()

    mine = {s["name"]: s for s in map(describe, orchestrator_spans.get_finished_spans())}
    theirs = {s["name"]: s for s in spans_of(spans_file, expected=3)}
    chain = [
        mine["agent run"],
        mine["dispatch_tool traced_step"],
        mine["apply_async/tools.traced_step"],
        theirs["run/tools.traced_step"],
        theirs["execute_tool traced_step"],
        theirs["inner x"],
    ]
    trace_id = f"{outer.get_span_context().trace_id:032x}"
    assert {span["trace_id"] for span in chain} == {trace_id}
    for parent, child in itertools.pairwise(chain):
        assert child["parent_id"] == parent["span_id"], (child["name"], parent["name"])


def test_a_remote_tool_invoked_directly_is_a_dispatch_span_parenting_the_worker_span(
    orchestrator_spans: InMemorySpanExporter,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Given a schema-only tool from discover_tools, when it is invoked directly (sync
    and async) inside a span, then each call is a dispatch span of that trace whose
    child is the worker's span of the call."""
    spans_file = tmp_path / "spans.jsonl"
    settings = make_settings(tool_modules=("tests.fleet_tools", "tests.otel_worker"))
    start_worker(
        settings, pool="prefork", concurrency=1, extra_env={"TOOLFLEET_TEST_SPANS": str(spans_file)}
    )
    dispatcher = dispatcher_for(settings=settings)
    tools = discover_tools(dispatcher=dispatcher, require=["traced_step"], wait=10)
    remote = next(t for t in tools if t.name == "traced_step")

    with otel_trace.get_tracer("tests.direct").start_as_current_span("caller") as outer:
        assert remote.invoke({"label": "sync"}) == "stepped sync"
        assert asyncio.run(remote.ainvoke({"label": "async"})) == "stepped async"

    trace_id = f"{outer.get_span_context().trace_id:032x}"
    dispatches = [
        describe(span)
        for span in orchestrator_spans.get_finished_spans()
        if span.name == "dispatch_tool traced_step"
    ]
    assert len(dispatches) == 2
    worker_spans = spans_of(spans_file, expected=4)
    for dispatch in dispatches:
        assert dispatch["trace_id"] == trace_id
        assert dispatch["attributes"]["toolfleet.outcome"] == "success"
        task = dispatch["attributes"]["toolfleet.task_id"]
        (executed,) = [s for s in worker_spans if s["attributes"].get("toolfleet.task_id") == task]
        assert (executed["trace_id"], executed["parent_id"]) == (trace_id, dispatch["span_id"])
