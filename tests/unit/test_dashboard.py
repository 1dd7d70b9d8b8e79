"""The Grafana dashboard asks only for series that toolfleet's exporters and Flower expose."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import promql_parser
import pytest
from prometheus_client.metrics_core import Metric

from orchestrator.server.routes.metrics import ServerMetrics
from tests.support.compose import services
from tests.support.fleet import REPO
from tool_workers.observability.metrics import WorkerMetrics

DASHBOARD = REPO / "config" / "grafana" / "toolfleet-dashboard.json"

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "gauge": ("",),
}

# Grafana's variables, as Prometheus would see them once Grafana filled them in.
_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$tool": ".*",
    "${datasource}": "prometheus",
}


def exposed(families: Iterable[Metric]) -> set[str]:
    """The sample names a scrape shows for these metric families."""
    return {f"{f.name}{suffix}" for f in families for suffix in _SUFFIXES[f.type]}


def worker_series(tmp_path: Path) -> set[str]:
    metrics = WorkerMetrics(tmp_path)
    return exposed([*metrics.calls.collect(), *metrics.duration.collect()])


def server_series() -> set[str]:
    runs = SimpleNamespace(
        running=0, active=0, max_runs=1, takeovers={"resumed": 0, "lost": 0}, handed_on=0
    )
    svc = SimpleNamespace(
        runs=runs, dispatcher=SimpleNamespace(in_flight=lambda: 0, data_losses=lambda: 0)
    )
    return exposed(ServerMetrics(svc).registry.collect())  # type: ignore[arg-type]


def flower_series() -> set[str]:
    from flower.events import get_prometheus_metrics

    flower = get_prometheus_metrics()
    return exposed(family for metric in vars(flower).values() for family in metric.collect())


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(board) for t in p.get("targets", [])]


def filled(expr: str) -> str:
    for name, value in _VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr}"
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(filled(expr)), visit)
    return names


@pytest.fixture
def known(tmp_path: Path) -> set[str]:
    return worker_series(tmp_path) | server_series() | flower_series()


def test_every_expression_names_only_series_that_exist(known: set[str]) -> None:
    """Given the dashboard, then each panel's PromQL parses and selects only series the
    workers, `toolfleet serve` or Flower expose; the tool variable reads a worker series."""
    board = dashboard()
    exprs = expressions(board)
    assert len(exprs) >= 10

    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= known, (expr, names - known)
        used |= names
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            (metric,) = re.findall(r"label_values\((\w+),", variable["definition"])
            assert metric in known

    # Built on all three sources.
    assert any(n.startswith("toolfleet_worker_") for n in used)
    assert any(n.startswith("toolfleet_server_") for n in used)
    assert any(n.startswith("flower_") for n in used)


def test_the_check_catches_a_misspelt_series(known: set[str]) -> None:
    """Given an expression with a series nobody exports, then the check names it."""
    names = metric_names('sum(rate(toolfleet_worker_call_total{tool=~"$tool"}[$__rate_interval]))')
    assert names - known == {"toolfleet_worker_call_total"}


def test_panels_are_laid_out_without_overlap() -> None:
    """Given the dashboard, then panel ids are unique and no two panels share a cell."""
    every = list(panels(dashboard()))
    assert len({p["id"] for p in every}) == len(every)
    cells: set[tuple[int, int]] = set()
    for panel in every:
        pos = panel["gridPos"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert pos["x"] + pos["w"] <= 24
        assert not mine & cells, panel["title"]
        cells |= mine


def test_compose_documents_every_metrics_port() -> None:
    """Given the compose file, then each worker service exposes the port its metrics
    listen on (compose itself scrapes nothing)."""
    env = {
        "REDIS_PASSWORD": "pw",
        "FLOWER_BASIC_AUTH": "ops:pw",
        "TOOLFLEET_API_TOKENS": "t",
        "TOOLFLEET_SIGNING_KEY": "3b8e1f6a9c2d5e7f0a4b6c8d1e3f5a7b",
    }
    specs = services(env)
    for name in ("tool-worker", "sandbox-worker"):
        port = str(specs[name]["environment"]["TOOLFLEET_METRICS_PORT"])
        assert port in {str(p) for p in specs[name].get("expose", [])}, name
    assert not any("prometheus" in name or "grafana" in name for name in specs)
