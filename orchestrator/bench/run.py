"""``toolfleet bench``: every scenario in one run, side by side, against its baselines.

Benchmarks are not timed tests: they print tables and write a report. The scenarios
(``orchestrator/bench/*.py``, one each):

* a. ``latency``: one trivial call, whole agent run; local ``ToolNode``, toolfleet sync
  and async; raw Celery and raw Redis round trips as floors.
* b. ``fanout``: N calls of ``sleep(0.5 s)`` in one AIMessage, tool phase against N; the
  orchestrator's cost of publishing 100 calls.
* c. ``throughput``: calls per second with K concurrent runs, against raw Celery.
* d. ``memory``: orchestrator RSS per in-flight call; nothing leaked after the runs.
* e. ``scale``: a sleep-bound fan-out on 1, 2 and 4 worker processes.
* f. ``links``: one call and a fan-out with 0, 20 and 50 ms of round-trip delay added
  between the hosts and Redis, with the round trips a call costs, counted.
* g. ``cost``: Redis commands, bytes on the wire and CPU (orchestrator, workers, server)
  per call, and calls per second, against a bare Celery app on the same server, and
  against a do-it-yourself agent (the same agent, its tool a bare Celery task awaited on
  a thread pool) at K and at a smaller K.

It starts what it needs: an embedded server and ``celery worker`` processes (or only
the workers, on the broker the settings name, with ``use_settings``), and stops them.
The workers are spawned before the scenarios (and with them LangChain and LangGraph) are
imported: they boot while this process imports.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.bench.fleet import BenchFleet, load_average, machine_info
from orchestrator.bench.measure import SETTLE, ScenarioTimeout, bounded
from orchestrator.bench.raw_worker import RawCeleryWorker, raw_worker_for
from orchestrator.bench.scenarios import NOT_QUICK, SCENARIOS
from orchestrator.cli.progress import cli_console, elapsed

REPORT_SCHEMA = 1

OWN_WORKERS = ("scale", "links", "cost")
"""Scenarios that start workers of their own and get the machine to themselves."""


@dataclass(frozen=True)
class Plan:
    """How much of each scenario to run, and how long each may take at most."""

    fleet_workers: int = 2
    fleet_concurrency: int = 300
    latency_iterations: int = 300
    latency_warmup: int = 20
    fanout_sizes: tuple[int, ...] = (1, 10, 100, 500)
    fanout_seconds: float = 0.5
    fanout_repeats: int = 7
    dispatch_n: int = 100
    """Calls published at once."""
    dispatch_repeats: int = 20
    throughput_runs: int = 16
    throughput_duration: float = 5.0
    throughput_warmup: float = 1.0
    throughput_rounds: int = 5
    memory_calls: int = 1000
    memory_seconds: float = 8.0
    scale_counts: tuple[int, ...] = (1, 2, 4)
    """How many workers each point of the scenario runs."""
    scale_concurrency: int = 4
    scale_calls: int = 160
    scale_seconds: float = 0.2
    scale_repeats: int = 3
    links_delays_ms: tuple[int, ...] = (0, 20, 50)
    links_calls: int = 20
    links_fanout: int = 50
    links_seconds: float = 0.5
    links_repeats: int = 3
    links_concurrency: int = 64
    cost_runs: int = 50
    cost_runs_small: int = 10
    """The second concurrency level of toolfleet's async runs and the do-it-yourself
    agent's (0: none)."""
    cost_turns: int = 5
    cost_width: int = 4
    cost_rounds: int = 3
    cost_pool: str = "prefork"
    cost_concurrency: int = 4
    cost_idle_seconds: float = 2.0
    cost_settle: float = SETTLE
    shared_cost: bool = False
    """Measure the cost on the run's own workers (and start the bare app's worker with
    them), instead of on a fleet of the scenario's own started after the others."""
    bound: float = 300.0
    """Seconds any one scenario may run before it is abandoned and reported as an error."""

    def of(self, scenario: str) -> dict[str, Any]:
        """The fields of ``scenario`` (those named ``<scenario>_…``), without the prefix:
        the keyword arguments of its ``run_…`` function."""
        prefix = f"{scenario}_"
        return {
            f.name.removeprefix(prefix): getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name.startswith(prefix)
        }


FULL = Plan()
QUICK = Plan(
    fleet_workers=1,
    fleet_concurrency=128,
    latency_iterations=10,
    latency_warmup=2,
    fanout_sizes=(1, 10, 50),
    fanout_seconds=0.1,
    fanout_repeats=1,
    dispatch_repeats=1,
    throughput_runs=4,
    throughput_duration=0.3,
    throughput_warmup=0.2,
    throughput_rounds=1,
    memory_calls=100,
    memory_seconds=0.5,
    scale_concurrency=2,
    scale_calls=16,
    scale_seconds=0.1,
    scale_repeats=1,
    links_calls=3,
    links_fanout=5,
    links_seconds=0.2,
    links_repeats=1,
    links_concurrency=8,
    cost_runs=4,
    cost_runs_small=2,
    cost_rounds=1,
    cost_pool="threads",
    cost_concurrency=2,
    cost_idle_seconds=0.3,
    cost_settle=0.2,
    shared_cost=True,
    bound=60.0,
)
"""Seconds-long: every scenario once at a tiny size on one worker that all of them share
(the bare Celery app's worker boots beside it), but scale and links
(they start hosts and workers of their own: tens of seconds on their own; run without
``--quick``). Every ratio is still measured against raw Celery in the same run."""


def select(only: str | None, quick: bool = False) -> list[str]:
    """Scenario names to run, from ``--only`` (ids or names, comma-separated); without it
    every scenario (with ``quick``, all but :data:`NOT_QUICK`).

    Raises:
        ValueError: an unknown scenario is named.
    """
    if not only:
        return [name for name in SCENARIOS.values() if not (quick and name in NOT_QUICK)]
    chosen = []
    for item in (part.strip() for part in only.split(",") if part.strip()):
        name = SCENARIOS.get(item, item)
        if name not in SCENARIOS.values():
            raise ValueError(f"unknown scenario {item!r}; choose from {', '.join(SCENARIOS)}")
        chosen.append(name)
    return [name for name in SCENARIOS.values() if name in chosen]


def run_bench(
    plan: Plan,
    *,
    quick: bool = False,
    use_settings: bool = False,
    scenarios: Iterable[str] = SCENARIOS.values(),
    console: Console | None = None,
    on_report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the scenarios against a fleet this call starts and stops; return the report.

    ``on_report`` gets the finished report before the fleet stops.
    """
    console = console or cli_console()
    wanted = list(scenarios)
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "quick": quick,
        "machine": machine_info(),
        "plan": dataclasses.asdict(plan),
        "scenarios": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="toolfleet-bench-") as tmp,
        BenchFleet(Path(tmp), use_settings=use_settings) as fleet,
    ):
        report["machine"]["broker"] = fleet.server_version() + (
            " (TOOLFLEET_BROKER_URL)" if use_settings else " (embedded)"
        )
        main = fleet.settings("main")
        main_workers = []
        # The cost scenario on the run's workers, when no scenario that wants the
        # machine to itself runs before it.
        shared_cost = (
            plan.shared_cost
            and "cost" in wanted
            and not any(name in OWN_WORKERS for name in wanted if name != "cost")
        )
        raw_worker: RawCeleryWorker | None = None
        if any(name not in OWN_WORKERS for name in wanted) or shared_cost:
            if shared_cost:
                try:
                    raw_worker = raw_worker_for(
                        fleet, main, pool="threads", concurrency=plan.fleet_concurrency
                    )
                except RuntimeError:
                    shared_cost = False  # the scenario reports why on its own
                else:
                    raw_worker.start()  # it boots beside toolfleet's, stops with it
                    fleet.others.append(raw_worker)
            console.print(
                f"starting {plan.fleet_workers} worker(s), threads pool of {plan.fleet_concurrency}"
                + (", and raw Celery's" if raw_worker is not None else "")
            )
            main_workers = fleet.spawn_workers(
                main, plan.fleet_workers, concurrency=plan.fleet_concurrency
            )
        # The scenarios import LangChain and LangGraph: seconds the workers spend booting.
        from orchestrator.bench.cost import run_cost
        from orchestrator.bench.fanout import run_dispatch_cost, run_fanout
        from orchestrator.bench.latency import run_latency
        from orchestrator.bench.links import run_links
        from orchestrator.bench.load import run_scale, run_throughput
        from orchestrator.bench.memory import leaks, run_memory
        from orchestrator.bench.targets import targets

        for worker in main_workers:
            worker.wait_ready(timeout=90)
        dispatcher = fleet.dispatcher(main)

        def cost() -> dict[str, Any]:
            args = plan.of("cost")
            if shared_cost:  # on the run's own workers, as they are when it starts
                args.update(
                    pool="threads", concurrency=plan.fleet_concurrency, workers=main_workers
                )
            settings = main if shared_cost else fleet.settings("cost")
            return run_cost(fleet, settings, **args, raw_worker=raw_worker)

        jobs: dict[str, Callable[[], dict[str, Any]]] = {
            "latency": lambda: run_latency(
                dispatcher, fleet.broker_url, **plan.of("latency"), budget=plan.bound / 2
            ),
            "fanout": lambda: {
                **run_fanout(
                    dispatcher,
                    **plan.of("fanout"),
                    budget=plan.bound / 2,
                    cpu_times=fleet.cpu_times,
                ),
                "dispatch": run_dispatch_cost(dispatcher, **plan.of("dispatch")),
            },
            "throughput": lambda: run_throughput(dispatcher, **plan.of("throughput")),
            "memory": lambda: run_memory(dispatcher, **plan.of("memory"), modes=("sync", "async")),
            "scale": lambda: run_scale(fleet, fleet.settings("scale"), **plan.of("scale")),
            "links": lambda: run_links(fleet, **plan.of("links")),
            "cost": cost,
        }
        for name in wanted:
            if name in OWN_WORKERS and not (shared_cost and name == "cost"):
                # These scenarios' workers get the machine to themselves.
                fleet.stop_workers(main_workers)
                main_workers = []
            t0 = time.perf_counter()
            console.print(f"scenario {name} ...")
            try:
                with elapsed(console, f"scenario {name} running"):
                    result = bounded(jobs[name], plan.bound, name, stop=fleet.stop_runs)
            except ScenarioTimeout as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
                # Its run was stopped by closing the dispatchers: the next get new ones.
                dispatcher = fleet.dispatcher(main)
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
            result["elapsed"] = time.perf_counter() - t0
            report["scenarios"][name] = result
            console.print(f"scenario {name} done in {result['elapsed']:.1f} s")
        report["leaks"] = leaks(fleet.dispatchers)
        report["machine"]["loadavg_end"] = load_average()
        report["targets"] = targets(report)
        if on_report is not None:
            on_report(report)
    return report


def main(
    *,
    quick: bool = False,
    json_path: Path | None = None,
    plot_path: Path | None = None,
    markdown_path: Path | None = None,
    use_settings: bool = False,
    only: str | None = None,
    console: Console | None = None,
) -> int:
    """The ``toolfleet bench`` command: run, print, write; 1 if a scenario failed to run.

    Targets that are missed do not fail the command: a benchmark reports, it does not test.
    """
    console = console or cli_console()
    scenarios = select(only, quick)
    if plot_path is not None:
        from orchestrator.bench.report import require_matplotlib

        require_matplotlib()

    def show(report: dict[str, Any]) -> None:
        _show(report, quick, console, json_path, plot_path, markdown_path)

    report = run_bench(
        QUICK if quick else FULL,
        quick=quick,
        use_settings=use_settings,
        scenarios=scenarios,
        console=console,
        on_report=show,
    )
    return 1 if any("error" in s for s in report["scenarios"].values()) else 0


def _show(
    report: dict[str, Any],
    quick: bool,
    console: Console,
    json_path: Path | None,
    plot_path: Path | None,
    markdown_path: Path | None,
) -> None:
    """Print the report's tables; write its JSON, plot and Markdown where asked."""
    from orchestrator.bench.report import markdown, print_tables, write_json, write_plot

    machine = report["machine"]
    console.print(
        f"\n[bold]toolfleet bench[/] {'(quick) ' if quick else ''}on {machine['cores']} cores, "
        f"{machine['ram_gib']:g} GiB, {machine['cpu']}, Python {machine['python']}, "
        f"{machine['broker']}, {machine['date']}, load average {machine['loadavg_start']:g} "
        f"at start, {machine['loadavg_end']:g} at end\n"
    )
    print_tables(report, console)
    if json_path is not None:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot_path is not None:
        write_plot(report, plot_path)
        console.print(f"wrote {plot_path}")
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(markdown(report), encoding="utf-8")
        console.print(f"wrote {markdown_path}")
