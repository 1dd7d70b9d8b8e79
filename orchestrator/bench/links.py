"""Scenario f: slow links. One call and a fan-out with delay added between hosts and Redis.

Two :class:`~orchestrator.bench.delay_proxy.DelayProxy` instances sit in front of the
server, one used by the worker (its broker and result connections) and one by the
orchestrator; each adds half the link's round-trip delay in each direction. At each
delay (0, 20 and 50 ms of added round trip) the scenario measures:

* a call's added latency: a whole agent run with one ``echo`` call, minus the same run
  with a local ``ToolNode`` (sync, so the two differ only in where the tool runs);
* the tool phase of one fan-out of N ``sleep`` calls (sync and async);
* the round trips one call costs, counted by the proxies while calls run one after
  another: every request (or pipeline of requests) a client sends and the server
  answers is one exchange, named by its Redis commands. The same count over an idle
  window of equal length (heartbeats, registry refreshes, health checks) is subtracted.
  The workers here renew their leases every :data:`LEASE_REFRESH` seconds, not every
  second: a renewal (and the sweep after it) is one round trip each, whatever the calls,
  with the held records of the calls settled since; one more or fewer in the busy window
  than in the idle one would move a count by 0.1 per call.
  On the worker's side the ``BRPOP`` that hands it the call is the broker's own
  delivery; the rest are what toolfleet and Celery add.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.bench.agents import (
    Marks,
    Runner,
    check_results,
    fleet_agent,
    local_agent,
    one_turn_model,
)
from orchestrator.bench.delay_proxy import DelayProxy
from orchestrator.bench.fleet import BenchFleet
from orchestrator.bench.measure import summarise
from orchestrator.bench.raw_celery import NOOP, create_raw_app
from orchestrator.bench.raw_worker import raw_worker_for
from orchestrator.dispatch.fleet import close_for

DELIVERY = "BRPOP"
"""The worker's exchange that is the broker's own delivery of a call."""


LEASE_REFRESH = 300.0
"""Seconds between the lease renewals of this scenario's workers: longer than any of
its windows, so that the counts are the calls' alone."""


def counting(settings: Any) -> Any:
    """``settings`` for a worker whose round trips are counted: its lease renewed once,
    at its start, within the scenario."""
    return settings.model_copy(
        update={"lease_refresh": LEASE_REFRESH, "lease_ttl": 3 * LEASE_REFRESH}
    )


def proxied(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the local proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


Counter = collections.Counter[str]


def _delta(after: tuple[int, dict[str, int]], before: tuple[int, dict[str, int]]) -> Counter:
    kinds = collections.Counter(after[1])
    kinds.subtract(before[1])
    return +kinds


def per_call(busy: Counter, idle: Counter, calls: int) -> dict[str, float]:
    """Exchanges per call by kind: the busy window's, less the idle window's."""
    out = {}
    for kind, count in busy.items():
        value = (count - idle.get(kind, 0)) / calls
        if value > 0.05:
            out[kind] = round(value, 2)
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def run_links(
    fleet: BenchFleet,
    *,
    delays_ms: tuple[int, ...],
    calls: int,
    fanout: int,
    seconds: float,
    repeats: int,
    concurrency: int,
) -> dict[str, Any]:
    """Measure one call and a fan-out at each added round-trip delay (milliseconds)."""
    points = []
    target = urlsplit(fleet.broker_url)
    host, port = target.hostname or "127.0.0.1", target.port or 6379
    # Beside, on a link with no delay (a count is the same on any link): a bare Celery
    # worker's, and a toolfleet worker's of the prefork pool (compose's), whose pool
    # processes run calls the worker's main process started.
    with DelayProxy(host, port, 0.0) as raw_link:
        raw = raw_round_trips(fleet, fleet.settings("links-raw"), raw_link, calls=calls)
    with DelayProxy(host, port, 0.0) as prefork_link:
        prefork = prefork_round_trips(
            fleet, counting(fleet.settings("links-prefork")), prefork_link, calls=calls
        )
    for delay_ms in delays_ms:
        one_way = delay_ms / 2000
        with (
            DelayProxy(host, port, one_way) as worker_link,
            DelayProxy(host, port, one_way) as orchestrator_link,
        ):
            group = counting(fleet.settings(f"links{delay_ms}"))
            worker_settings = group.model_copy(
                update={"broker_url": proxied(fleet.broker_url, worker_link.port)}
            )
            main_settings = group.model_copy(
                update={"broker_url": proxied(fleet.broker_url, orchestrator_link.port)}
            )
            workers = fleet.start_workers(worker_settings, 1, concurrency=concurrency)
            try:
                point = _measure(
                    fleet,
                    main_settings,
                    (orchestrator_link, worker_link),
                    calls=calls,
                    fanout=fanout,
                    seconds=seconds,
                    repeats=repeats,
                )
            finally:
                # Before its link goes: the dispatcher's listener would report the loss.
                close_for(main_settings)
                fleet.stop_workers(workers)
        points.append({"delay_ms": delay_ms, **point})
    return {
        "fanout": fanout,
        "seconds": seconds,
        "calls": calls,
        "celery_raw": raw,
        "prefork": prefork,
        "points": points,
    }


def raw_round_trips(
    fleet: BenchFleet, settings: Any, link: DelayProxy, *, calls: int
) -> dict[str, Any]:
    """The round trips a bare Celery worker (:mod:`orchestrator.bench.raw_celery`: late
    acknowledgement, kombu's Redis transport, Celery's Redis backend) has per ``noop``
    call, counted on ``link`` as toolfleet's are, calls one after another."""
    worker = raw_worker_for(
        fleet, settings, pool="prefork", concurrency=2, reach=lambda url: proxied(url, link.port)
    )
    worker.start()
    app = create_raw_app(fleet.broker_url, worker.prefix)
    try:
        worker.wait_ready(timeout=90)
        return _counted(link, lambda: app.send_task(NOOP, args=("call",)).get(timeout=30), calls)
    finally:
        app.close()
        fleet.stop_workers([worker])


def prefork_round_trips(
    fleet: BenchFleet, settings: Any, link: DelayProxy, *, calls: int
) -> dict[str, Any]:
    """The round trips a toolfleet worker of the prefork pool (one process) has per
    ``echo`` call, counted on ``link``, whole agent runs one after another."""
    reached = settings.model_copy(update={"broker_url": proxied(fleet.broker_url, link.port)})
    workers = fleet.start_workers(reached, 1, pool="prefork", concurrency=1)
    runner = Runner()
    remote = fleet_agent(one_turn_model([("echo", {"text": "hi"})]), fleet.dispatcher(settings))
    try:
        check_results(runner.run(remote, "sync"), 1)  # the pool process's connection
        return _counted(link, lambda: check_results(runner.run(remote, "sync"), 1), calls)
    finally:
        runner.close()
        close_for(settings)
        fleet.stop_workers(workers)


def _counted(link: DelayProxy, call: Callable[[], Any], calls: int) -> dict[str, Any]:
    """A worker's exchanges on ``link`` per call while ``call`` is made ``calls`` times,
    one after another, less those of an idle window as long."""
    before = link.exchanges.snapshot()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    window = time.perf_counter() - t0
    busy = _delta(link.exchanges.snapshot(), before)
    before = link.exchanges.snapshot()
    time.sleep(window)
    trips = per_call(busy, _delta(link.exchanges.snapshot(), before), calls)
    return {
        "worker": trips,
        "worker_beyond_delivery": round(sum(v for k, v in trips.items() if k != DELIVERY), 2),
    }


def _measure(
    fleet: BenchFleet,
    settings: Any,
    links: tuple[DelayProxy, DelayProxy],
    *,
    calls: int,
    fanout: int,
    seconds: float,
    repeats: int,
) -> dict[str, Any]:
    dispatcher = fleet.dispatcher(settings)
    runner = Runner()
    echo = [("echo", {"text": "hi"})]
    remote = fleet_agent(one_turn_model(echo), dispatcher)
    local = local_agent(one_turn_model(echo))
    marks = Marks()
    sleeps = [("sleep", {"seconds": seconds})] * fanout
    spread = fleet_agent(one_turn_model(sleeps, marks), dispatcher)
    try:
        for mode in ("sync", "async"):  # connections, subscriptions, caches
            check_results(runner.run(remote, mode), 1)
        added: list[float] = []
        before = [link.exchanges.snapshot() for link in links]
        t0 = time.perf_counter()
        for _ in range(calls):
            t1 = time.perf_counter()
            check_results(runner.run(remote, "sync"), 1)
            t2 = time.perf_counter()
            runner.run(local, "sync")
            # The local run costs the same at any delay; it is subtracted per round.
            added.append((t2 - t1) - (time.perf_counter() - t2))
        window = time.perf_counter() - t0
        busy = [_delta(link.exchanges.snapshot(), b) for link, b in zip(links, before, strict=True)]
        before = [link.exchanges.snapshot() for link in links]
        time.sleep(window)
        idle = [_delta(link.exchanges.snapshot(), b) for link, b in zip(links, before, strict=True)]
        orchestrator, worker = (per_call(b, i, calls) for b, i in zip(busy, idle, strict=True))
        phases: dict[str, list[float]] = {"sync": [], "async": []}
        for _ in range(repeats):
            for mode in phases:
                marks.clear()
                check_results(runner.run(spread, mode), fanout)
                phases[mode].append(marks.tool_phase())
    finally:
        runner.close()
    return {
        "added": summarise(added),
        "round_trips": {
            "orchestrator": orchestrator,
            "worker": worker,
            "orchestrator_total": round(sum(orchestrator.values()), 2),
            "worker_total": round(sum(worker.values()), 2),
            "worker_beyond_delivery": round(sum(v for k, v in worker.items() if k != DELIVERY), 2),
        },
        "fanout_phase": {mode: summarise(values) for mode, values in phases.items()},
    }
