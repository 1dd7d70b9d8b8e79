"""``GET /metrics``: this replica's runs and tool calls for Prometheus (no token needed).

Like Flower's ``/metrics`` it answers without authentication (scrapers rarely carry
tokens); it shows counts and timings, never a run's content. Series::

    toolfleet_server_runs_active          runs whose graph is executing
    toolfleet_server_runs_queued          accepted runs waiting to start (thread busy,
                                          ``after_seconds``)
    toolfleet_server_runs_max             TOOLFLEET_MAX_RUNS
    toolfleet_server_calls_in_flight      tool calls this replica waits on
    toolfleet_server_call_dispatch_to_start_seconds{tool}   histogram: from publishing a
                                          call to the worker's start notice
    toolfleet_server_call_result_wait_seconds{tool}         histogram: from publishing a
                                          call to its result arriving
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from orchestrator.dispatch.timings import CallTimings
from orchestrator.server.services import Services

router = APIRouter(tags=["system"])

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Seconds: a call that starts in a millisecond to one that waits minutes in a queue."""


class ServerMetrics:
    """The replica's registry: gauges read at scrape time, histograms fed by the dispatcher."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.registry = CollectorRegistry(auto_describe=False)
        self.dispatch_to_start = Histogram(
            "toolfleet_server_call_dispatch_to_start_seconds",
            "Seconds from publishing a tool call to the worker's start notice.",
            ["tool"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.result_wait = Histogram(
            "toolfleet_server_call_result_wait_seconds",
            "Seconds from publishing a tool call to its result arriving.",
            ["tool"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(svc))
        self.timings = CallTimings(
            on_start=lambda tool, s: self.dispatch_to_start.labels(tool).observe(s),
            on_result=lambda tool, s: self.result_wait.labels(tool).observe(s),
        )

    def render(self) -> bytes:
        """The exposition text of every series."""
        return generate_latest(self.registry)


class _Gauges:
    def __init__(self, svc: Services) -> None:
        self._svc = svc

    def collect(self) -> Iterator[Metric]:
        runs = self._svc.runs
        running = runs.running
        yield _gauge("toolfleet_server_runs_active", "Runs whose graph is executing.", running)
        yield _gauge(
            "toolfleet_server_runs_queued",
            "Accepted runs waiting to start (their thread busy, or after_seconds).",
            max(runs.active - running, 0),
        )
        yield _gauge(
            "toolfleet_server_runs_max", "Runs this replica executes at most.", runs.max_runs
        )
        yield _gauge(
            "toolfleet_server_calls_in_flight",
            "Tool calls this replica waits on.",
            self._svc.dispatcher.in_flight(),
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def attach(app: FastAPI, svc: Services) -> ServerMetrics:
    """Build the replica's metrics over ``svc`` and time the dispatcher's calls."""
    metrics = ServerMetrics(svc)
    svc.dispatcher.timings = metrics.timings
    app.state.metrics = metrics
    return metrics


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus exposition of this replica's runs and tool calls."""
    found: ServerMetrics = request.app.state.metrics
    return Response(found.render(), media_type=CONTENT_TYPE_LATEST)
