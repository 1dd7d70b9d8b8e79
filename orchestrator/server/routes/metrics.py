"""``GET /metrics``: this replica's runs and tool calls for Prometheus (no token needed).

Like Flower's ``/metrics`` it answers without authentication (scrapers rarely carry
tokens); it shows counts and timings, never a run's content. Series::

    toolfleet_server_runs_active          runs whose graph is executing
    toolfleet_server_runs_queued          accepted runs waiting to start (thread busy,
                                          ``after_seconds``)
    toolfleet_server_runs_max             TOOLFLEET_MAX_RUNS
    toolfleet_server_calls_in_flight      tool calls this replica waits on
    toolfleet_server_runs_taken_over_total{outcome}  runs of replicas that went away taken
                                          over: ``resumed`` or ``lost`` (ended RunLost)
    toolfleet_server_runs_handed_on_total runs stopped here for another replica to go on
                                          with (a drain, a lease lost or not renewed)
    toolfleet_server_redis_data_lost_total  losses of toolfleet's records in Redis this
                                          replica noticed (:mod:`tool_workers.contract.epoch`)
    toolfleet_server_call_dispatch_to_start_seconds{tool}   histogram: from publishing a
                                          call to the worker's start notice
    toolfleet_server_call_result_wait_seconds{tool}         histogram: from publishing a
                                          call to its result arriving
    toolfleet_queue_waiting_calls{queue}  calls waiting in the broker, per queue
    toolfleet_tool_waiting_calls{tool}    per tool (its tool queues)
    toolfleet_worker_kind_waiting_calls{kind}  in the queues a kind of worker consumes
                                          (node name before ``@``): what to scale it on
    toolfleet_server_calls_max            TOOLFLEET_MAX_CALLS
    toolfleet_server_tenant_calls_max     TOOLFLEET_TENANT_MAX_CALLS
    toolfleet_server_tenant_calls_in_flight{tenant_hash}  a tenant's tool calls in flight
    toolfleet_server_tenant_calls_waiting{tenant_hash}    a tenant's calls waiting their turn
    toolfleet_server_tenant_storage_max_bytes             TOOLFLEET_TENANT_MAX_BYTES
    toolfleet_server_tenant_storage_bytes{tenant_hash}    the bytes a tenant keeps (as this
                                          replica last counted them)

``tenant_hash`` never names a tenant: it is the first 12 hex digits of an HMAC-SHA256 of
the tenant id under the deployment's tenant key (:func:`tenant_hash`), so a scrape tells
tenants apart without saying who they are (or giving away a bare token's tenant id).

The waiting calls are read from the broker at most every :data:`WAITING_SECONDS`
(``LLEN`` pipeline on Redis, passive declares on RabbitMQ), whichever replica scrapes.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from orchestrator import fairshare
from orchestrator.cli.status import Waiting, read_waiting
from orchestrator.dispatch.timings import CallTimings
from orchestrator.server.services import Services

log = logging.getLogger("toolfleet.server")

router = APIRouter(tags=["system"])

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Seconds: a call that starts in a millisecond to one that waits minutes in a queue."""


class ServerMetrics:
    """The replica's registry: gauges read at scrape time, histograms fed by the dispatcher."""

    def __init__(self, svc: Services, label_key: bytes = b"") -> None:
        self.svc = svc
        self.registry = CollectorRegistry(auto_describe=False)
        self.dispatch_to_start = self._per_tool(
            "toolfleet_server_call_dispatch_to_start_seconds",
            "Seconds from publishing a tool call to the worker's start notice.",
        )
        self.result_wait = self._per_tool(
            "toolfleet_server_call_result_wait_seconds",
            "Seconds from publishing a tool call to its result arriving.",
        )
        self.registry.register(_Gauges(svc))
        self.registry.register(_TenantGauges(svc, label_key))
        self.timings = CallTimings(
            on_start=lambda tool, s: self.dispatch_to_start.labels(tool).observe(s),
            on_result=lambda tool, s: self.result_wait.labels(tool).observe(s),
        )

    def _per_tool(self, name: str, documentation: str) -> Histogram:
        return Histogram(name, documentation, ["tool"], buckets=BUCKETS, registry=self.registry)

    def render(self) -> bytes:
        """The exposition text of every series."""
        return generate_latest(self.registry)


WAITING_SECONDS = 2.0
"""How long a read of the broker's waiting calls is reused between scrapes."""


class _Gauges:
    def __init__(self, svc: Services) -> None:
        self._svc = svc
        self._waiting: Waiting | None = None
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def waiting(self) -> Waiting | None:
        """The broker's waiting calls (cached; ``None`` when the broker cannot be read)."""
        with self._lock:
            if time.monotonic() - self._read_at > WAITING_SECONDS:
                dispatcher = self._svc.dispatcher
                try:
                    self._waiting = read_waiting(dispatcher.settings, dispatcher.app)
                except Exception as exc:  # a scrape shows what it can
                    log.warning("cannot read the waiting calls: %r", exc)
                    self._waiting = None
                self._read_at = time.monotonic()
            return self._waiting

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
        taken = CounterMetricFamily(
            "toolfleet_server_runs_taken_over",
            "Runs of replicas that went away this replica took over: resumed from their "
            "checkpoint, or lost (ended RunLost: no shared checkpoints, attempts used up).",
            labels=["outcome"],
        )
        for outcome, count in runs.takeovers.items():
            taken.add_metric([outcome], count)
        yield taken
        yield CounterMetricFamily(
            "toolfleet_server_runs_handed_on",
            "Runs this replica stopped for another replica to go on with (a drain, a "
            "lease it lost or could not renew).",
            value=runs.handed_on,
        )
        yield CounterMetricFamily(
            "toolfleet_server_redis_data_lost",
            "Losses of toolfleet's records in Redis (a restart without persistence, a "
            "FLUSHALL, a failover to a replica behind) this replica noticed.",
            value=self._svc.dispatcher.data_losses(),
        )
        waiting = self.waiting()
        if waiting is None:
            return
        for name, label, doc, values in (
            ("toolfleet_queue_waiting_calls", "queue", "per queue", waiting.queues),
            ("toolfleet_tool_waiting_calls", "tool", "per tool", waiting.tools),
            (
                "toolfleet_worker_kind_waiting_calls",
                "kind",
                "in the queues each kind of worker consumes",
                waiting.kinds,
            ),
        ):
            family = GaugeMetricFamily(name, f"Calls waiting in the broker, {doc}.", labels=[label])
            for key, value in sorted(values.items()):
                family.add_metric([key], value)
            yield family


def tenant_hash(label_key: bytes, tenant: str) -> str:
    """The ``tenant_hash`` label of a tenant's series: 12 hex digits of an HMAC-SHA256 of
    its id under the deployment's tenant key (an operator with the key can work it out
    for a tenant; a scrape alone says nothing of who it is)."""
    return hmac.new(label_key, f"metrics\x1f{tenant}".encode(), hashlib.sha256).hexdigest()[:12]


MAX_TENANT_SERIES = 1000
"""Most tenants one scrape shows a series for (the busiest first)."""


class _TenantGauges:
    """Per-tenant shares and storage, each tenant under its hash, never its id."""

    def __init__(self, svc: Services, label_key: bytes) -> None:
        self._svc = svc
        self._key = label_key

    def collect(self) -> Iterator[Metric]:
        gate = fairshare.installed()
        # (a stand-in of the services, as the dashboard's test builds, may have no store)
        quota = getattr(getattr(self._svc, "store", None), "quota", None)
        if gate is not None:
            yield _gauge(
                "toolfleet_server_calls_max",
                "Tool calls this replica's runs have in flight at most.",
                gate.total,
            )
            yield _gauge(
                "toolfleet_server_tenant_calls_max",
                "Tool calls of one tenant in flight at most on this replica.",
                gate.per_tenant,
            )
            yield self._family(
                "toolfleet_server_tenant_calls_in_flight",
                "Tool calls of a tenant in flight on this replica.",
                gate.in_flight(),
            )
            yield self._family(
                "toolfleet_server_tenant_calls_waiting",
                "Tool calls of a tenant waiting for their turn on this replica.",
                gate.waiting(),
            )
        if quota is not None:
            yield _gauge(
                "toolfleet_server_tenant_storage_max_bytes",
                "Bytes one tenant may keep through the API (TOOLFLEET_TENANT_MAX_BYTES).",
                quota.max_bytes,
            )
            yield self._family(
                "toolfleet_server_tenant_storage_bytes",
                "Bytes a tenant keeps through the API, as this replica last counted them.",
                dict(quota.seen),
            )

    def _family(self, name: str, documentation: str, values: dict[str, int]) -> Metric:
        family = GaugeMetricFamily(name, documentation, labels=["tenant_hash"])
        busiest = sorted(values.items(), key=lambda kv: -kv[1])[:MAX_TENANT_SERIES]
        for tenant, value in busiest:
            family.add_metric([tenant_hash(self._key, tenant)], value)
        return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def attach(app: FastAPI, svc: Services, label_key: bytes = b"") -> ServerMetrics:
    """Build the replica's metrics over ``svc`` and time the dispatcher's calls
    (``label_key``: the key tenants' labels are hashed with)."""
    metrics = ServerMetrics(svc, label_key)
    svc.dispatcher.timings = metrics.timings
    app.state.metrics = metrics
    return metrics


def snapshot(svc: Services) -> dict[str, Any]:
    """``/metrics?format=json``: this replica's runs as LangGraph's server counts its own
    (``queue``: runs waiting and executing; ``workers``: its cap of executing runs), and
    its tool calls in flight."""
    runs = svc.runs
    running = runs.running
    return {
        "queue": {"n_pending": max(runs.active - running, 0), "n_running": running},
        "workers": {
            "max": runs.max_runs,
            "active": running,
            "available": max(runs.max_runs - running, 0),
        },
        "calls": {"in_flight": svc.dispatcher.in_flight()},
    }


@router.get("/metrics", response_class=Response)
async def metrics(
    request: Request,
    format: Annotated[
        Literal["prometheus", "json"], Query(description="exposition text, or a JSON summary")
    ] = "prometheus",
) -> Response:
    """This replica's runs and tool calls: Prometheus exposition (default), or with
    ``format=json`` a summary of its runs (:func:`snapshot`)."""
    found: ServerMetrics = request.app.state.metrics
    if format == "json":
        return JSONResponse(snapshot(found.svc))
    # The waiting calls are read from the broker: off the event loop.
    return Response(await run_in_threadpool(found.render), media_type=CONTENT_TYPE_LATEST)
