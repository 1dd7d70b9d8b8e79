"""``toolfleet status``: workers online, queue depths, tools per queue, in-flight calls,
the routing of each tool, and what an autoscaler watches for each kind of worker.

Where each number comes from:

* **workers online, tools per queue**: the registry the workers publish
  (:func:`tool_workers.contract.fleet.read_entries`); an entry expires three refresh
  intervals after its worker stopped refreshing it. A worker serving ``run_python``
  names in it the isolation between its calls (``namespaces``, ``uid`` or ``none``, and
  whether it refuses calls for want of more), shown per worker.
* **queue depth**: calls waiting in the broker. kombu's Redis transport keeps a queue
  as a list named by the queue (``<namespace>:`` first when a namespace is set); with
  kombu's default priority steps, also a list per step (``<queue>\\x06\\x16<n>``).
  toolfleet's apps have one step, so one list, but the depth still sums the ``LLEN`` of
  all of kombu's default lists (another app's calls count), one pipeline for all
  queues. Calls a worker has already fetched are not in it. (Not kombu's passive
  ``queue_declare``: its existence check ignores the namespace prefix.) On RabbitMQ
  the depth is the message count of a passive ``queue_declare`` of the queue's broker
  name (ready messages: those delivered to a worker and not yet acknowledged are not
  counted either).
* **routing**: each served version of each tool, the queue this orchestrator's policy
  routes it to (its tool queue ``tool:<name>:<version>`` unless the policy file names a
  queue) and the workers serving it; a warning for each queue consumed by a worker that
  does not serve a tool sent there (such calls are handed on, a hop each).
* **worker kinds**: workers grouped by node name before ``@`` (less a ``-<number>``),
  with the broker keys of the queues they consume (the Redis lists, or RabbitMQ queues,
  an autoscaler watches) and the calls waiting there.
* **in-flight calls**: Celery's ``inspect active`` sent to the registered workers: the
  calls a worker has started and not finished, answered by the workers themselves. One
  broadcast that returns as soon as every registered worker replied (at most
  ``timeout`` seconds). It is exact where the alternatives are not: the
  ``toolfleet:started:*`` run markers live for ``result_expires`` (a day) after their
  call finished, so counting them against results means a scan of every call of the
  day, and the broker's ``unacked`` hash also holds calls reserved but not started. A
  worker that does not answer in time is listed as unresponsive, its calls not counted.
  The replies carry the call's kwargsrepr (tool, call id, thread id) and its arguments
  masked.
* **twin workers**: two processes started with one node name share its registry entry
  (and its control queue: only one of them answers), so each also notes its ``host:pid``
  in the name's ``worker-processes`` set; more than one member refreshed within the
  entry's lifetime is a warning. (A worker that crashed and was restarted at once looks
  like a twin for up to three refresh intervals.)
* **tool placement**: the record each orchestrator process published at its agent's
  first model call (host, pid, time). A record of a process on this host is shown only
  while that pid is alive; one of another host, which this one cannot check, is a line
  saying when it was published (``--json`` has every live record in full).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS, Channel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.dispatch.registry import served_versions
from tool_workers.contract.amqp import broker_queue_name
from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import redis_client
from tool_workers.contract.epoch import read_losses
from tool_workers.contract.fleet import read_entries
from tool_workers.contract.models import WorkerEntry
from tool_workers.contract.names import (
    REGISTRY_TTL_REFRESHES,
    placement_pattern,
    tool_from_task,
    tool_queue,
    worker_processes_key,
)
from tool_workers.contract.primary import read_primary, sentinel_primary
from tool_workers.contract.settings import Settings, is_sentinel_url


@dataclass(frozen=True)
class WorkerStatus:
    """One live worker, as its registry entry and its ``inspect active`` reply show it."""

    name: str
    pid: int
    queues: list[str]
    tools: list[str]
    active: int | None
    """Calls running on it now; ``None`` when it did not answer."""
    last_seen: float
    """Seconds since it last refreshed its registry entry."""
    sandbox_isolation: str | None = None
    """The isolation between its ``run_python`` calls (``None``: it does not serve it)."""


@dataclass(frozen=True)
class QueueStatus:
    """One queue: calls waiting, who consumes it, which tools go there."""

    name: str
    depth: int
    workers: int
    tools: list[str]


@dataclass(frozen=True)
class ToolRoute:
    """One served version of a tool: where this orchestrator's policy routes its calls."""

    tool: str
    version: str
    queue: str
    """The queue calls of this version go to (its tool queue unless routed by hand)."""
    workers: list[str]
    """Live workers serving the tool at this version."""
    shown: bool
    """Whether models are shown this version (the others serve calls made with theirs)."""


@dataclass(frozen=True)
class WorkerKind:
    """Workers of one kind (their node name before ``@``): what an autoscaler watches."""

    kind: str
    workers: int
    queues: list[str]
    keys: list[str]
    """The Redis lists (or RabbitMQ queues) its calls wait in, as the broker names them."""
    waiting: int


@dataclass(frozen=True)
class InFlightCall:
    """A call a worker is running now."""

    tool: str
    task_id: str
    worker: str
    call: str
    """The call's kwargsrepr: ``(<tool> call=<tool_call_id> thread=<thread id> queue=<q>)``."""
    running_for: float | None


@dataclass(frozen=True)
class FleetStatus:
    """Everything ``toolfleet status`` shows."""

    namespace: str
    workers: list[WorkerStatus]
    queues: list[QueueStatus]
    in_flight: list[InFlightCall]
    unresponsive: list[str] = field(default_factory=list)
    """Registered workers that did not answer ``inspect active`` in time."""
    placement: list[dict[str, Any]] = field(default_factory=list)
    """Where the tools of the agents of live orchestrator processes run (one per process)."""
    duplicates: list[str] = field(default_factory=list)
    """Node names more than one worker process answered as."""
    routes: list[ToolRoute] = field(default_factory=list)
    """Per tool and served version: its queue and the workers serving it."""
    kinds: list[WorkerKind] = field(default_factory=list)
    """Per worker kind: the queues and broker keys its calls wait in."""
    warnings: list[str] = field(default_factory=list)
    """Routing problems: a queue whose consumers do not all serve the tools sent there."""
    data_losses: list[dict[str, Any]] = field(default_factory=list)
    """Losses of toolfleet's records in Redis that a worker or orchestrator noticed,
    newest first (:mod:`tool_workers.contract.epoch`): ``at``, ``side``, ``host``, ``how``."""
    primary: dict[str, Any] = field(default_factory=dict)
    """The Redis primary the fleet uses (:mod:`tool_workers.contract.primary`):
    ``address``, ``sentinel_master`` (``None``: a direct URL), ``since`` and, after a
    failover its workers saw, ``previous`` and ``changed_at``."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (``toolfleet status --json``)."""
        data = asdict(self)
        data["in_flight_count"] = len(self.in_flight)
        return data


def collect(settings: Settings, *, app: Celery | None = None, timeout: float = 2.0) -> FleetStatus:
    """Read the fleet's status from the registry, the broker and the workers.

    Args:
        settings: Where the broker is and which namespace to look at.
        app: The Celery app to inspect with (default: one built from ``settings``).
        timeout: Seconds to wait for the workers' ``inspect active`` replies.
    """
    app = app or create_app(settings)
    client = redis_client(settings.own_redis_url, settings)
    try:
        entries = read_entries(client, settings.key_prefix)
        queues = _queues(client, settings, entries, app)
        routes = tool_routes(entries, settings)
        kinds = worker_kinds(settings, entries, app, {q.name: q.depth for q in queues})
        warnings = routing_warnings(entries, routes)
        placement = live_placement(_placement(client, settings))
        duplicates = _twins(client, settings, [e.worker for e in entries])
        losses = read_losses(client, settings.key_prefix)
        primary = _primary(client, settings)
    finally:
        client.close()
    active, unresponsive = _active(app, [e.worker for e in entries], timeout)
    now = time.time()
    workers = [
        WorkerStatus(
            name=e.worker,
            pid=e.pid,
            queues=list(e.queues),
            tools=sorted(spec.name for spec in e.tools),
            active=len(active[e.worker]) if e.worker in active else None,
            last_seen=round(max(now - e.updated_at, 0.0), 1),
            sandbox_isolation=e.sandbox_isolation,
        )
        for e in sorted(entries, key=lambda e: e.worker)
    ]
    in_flight = [
        InFlightCall(
            tool=tool_from_task(str(task.get("name"))) or str(task.get("name")),
            task_id=str(task.get("id")),
            worker=worker,
            call=str(task.get("kwargs", "")),
            running_for=round(now - task["time_start"], 1) if task.get("time_start") else None,
        )
        for worker, tasks in sorted(active.items())
        for task in tasks
    ]
    return FleetStatus(
        settings.namespace,
        workers,
        queues,
        in_flight,
        unresponsive,
        placement,
        duplicates,
        routes,
        kinds,
        warnings,
        losses,
        primary,
    )


def _primary(client: redis.Redis, settings: Settings) -> dict[str, Any]:
    """The primary the Sentinels name now (with what the workers noted of failovers),
    or the direct URL's host and port."""
    if not is_sentinel_url(settings.own_redis_url):
        parts = urlsplit(settings.own_redis_url)
        address = f"{parts.hostname}:{parts.port or 6379}" if parts.hostname else parts.path
        return {"address": address, "sentinel_master": None}
    noted = read_primary(client, settings.key_prefix)
    return {
        **noted,
        "address": sentinel_primary(client) or noted.get("address"),
        "sentinel_master": settings.sentinel_master,
    }


def tool_routes(entries: list[WorkerEntry], settings: Settings) -> list[ToolRoute]:
    """Every served version of every tool, routed as this orchestrator's policy routes it."""
    offered: dict[tuple[str, str], list[str]] = defaultdict(list)
    for entry in entries:
        for spec in entry.tools:
            offered[(spec.name, spec.version)].append(entry.worker)
    routes = []
    served = served_versions(entries, settings.policies(), shared=settings.registry_shared_names)
    for name, versions in sorted(served.items()):
        for i, (version, spec) in enumerate(versions.items()):
            workers = sorted(offered[(name, version)])
            routes.append(ToolRoute(name, version, spec.queue, workers, i == 0))
    return routes


def routing_warnings(entries: list[WorkerEntry], routes: list[ToolRoute]) -> list[str]:
    """Tools whose calls this orchestrator's policy sends to a queue no live worker
    consumes: those calls wait there until ``TOOLFLEET_UNSERVED_WAIT`` fails them.

    A queue whose consumers serve different tools (the quick start's kinds sharing
    ``tools``) is no warning: a call that reaches a worker not serving its tool is handed
    on to one that does (:mod:`tool_workers.celery_ext.hand_on`), so nothing goes wrong.
    """
    consumed = {queue for entry in entries for queue in entry.queues}
    stranded: dict[str, set[str]] = defaultdict(set)
    for route in routes:
        if route.queue not in consumed:
            stranded[route.queue].add(route.tool)
    return [
        f"queue {queue!r}: the policy file routes {', '.join(sorted(tools))} there and no "
        "live worker consumes it; such calls wait, then fail (start a worker with "
        f"-Q {queue}, or route them elsewhere)"
        for queue, tools in sorted(stranded.items())
    ]


def kind_of(worker: str) -> str:
    """A worker's kind: its node name before ``@``, less a trailing ``-<number>``
    (``-n builtins@%h`` and ``-n builtins-2@%h`` are both ``builtins``)."""
    name = worker.partition("@")[0]
    stem, sep, number = name.rpartition("-")
    return stem if sep and stem and number.isdigit() else name


def broker_key(settings: Settings, app: Celery, queue: str) -> str:
    """The name the broker keeps ``queue`` under: the Redis list kombu pushes calls onto
    (``<namespace>:<queue>``; with kombu's default priority steps, a priority call goes
    to ``<key>\\x06\\x16<n>``), or the RabbitMQ queue."""
    if settings.broker_is_amqp:
        return broker_queue_name(app, queue)
    return f"{settings.namespace}:{queue}" if settings.namespace else queue


def worker_kinds(
    settings: Settings, entries: list[WorkerEntry], app: Celery, depths: dict[str, int]
) -> list[WorkerKind]:
    """Each worker kind's queues, the broker keys its calls wait in, and how many wait."""
    workers: dict[str, int] = defaultdict(int)
    queues: dict[str, set[str]] = defaultdict(set)
    for entry in entries:
        kind = kind_of(entry.worker)
        workers[kind] += 1
        queues[kind].update(entry.queues)
    return [
        WorkerKind(
            kind,
            workers[kind],
            sorted(queues[kind]),
            [broker_key(settings, app, q) for q in sorted(queues[kind])],
            sum(depths.get(q, 0) for q in queues[kind]),
        )
        for kind in sorted(workers)
    ]


@dataclass(frozen=True)
class Waiting:
    """Calls waiting in the broker: per queue, per tool and per worker kind."""

    queues: dict[str, int]
    tools: dict[str, int]
    """A tool's calls in its tool queues, and in a queue the policy routes it alone to."""
    kinds: dict[str, int]
    """Calls waiting in the queues each kind of worker consumes."""


def read_waiting(settings: Settings, app: Celery) -> Waiting:
    """Calls waiting now, for Prometheus (``toolfleet serve``'s ``/metrics``)."""
    client = redis_client(settings.own_redis_url, settings)
    try:
        entries = read_entries(client, settings.key_prefix)
        queues = _queues(client, settings, entries, app)
    finally:
        client.close()
    depths = {q.name: q.depth for q in queues}
    routes = tool_routes(entries, settings)
    carried: dict[str, set[str]] = defaultdict(set)
    for route in routes:
        carried[route.queue].add(route.tool)
    tools: dict[str, int] = defaultdict(int)
    for queue, names in carried.items():
        if len(names) == 1:
            tools[next(iter(names))] += depths.get(queue, 0)
    kinds = {k.kind: k.waiting for k in worker_kinds(settings, entries, app, depths)}
    return Waiting(depths, dict(tools), kinds)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def live_placement(
    records: list[dict[str, Any]], *, host: str | None = None
) -> list[dict[str, Any]]:
    """The placement records not known dead: on this host, those whose pid is alive.

    Orchestrator processes publish once and may exit at any time; their records outlive
    them for a day. Another host's processes cannot be checked from here: kept.
    """
    host = host or socket.gethostname()
    live = []
    for record in records:
        pid = record.get("pid")
        if record.get("host") == host and not (isinstance(pid, int) and _pid_alive(pid)):
            continue
        live.append(record)
    return live


def _placement(client: redis.Redis, settings: Settings) -> list[dict[str, Any]]:
    """The tool placement orchestrator processes published (their agents' first model call)."""
    keys = sorted(client.scan_iter(match=placement_pattern(settings.key_prefix), count=500))
    records = []
    for raw in client.mget(keys) if keys else []:
        if raw is None:
            continue
        try:
            records.append(json.loads(raw))
        except ValueError:
            continue
    return records


def _active(
    app: Celery, workers: list[str], timeout: float
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Each registered worker's running calls, and the workers that did not answer."""
    if not workers:
        return {}, []
    # limit: stop waiting once every registered worker has answered.
    inspect = app.control.inspect(destination=workers, timeout=timeout, limit=len(workers))
    replies = inspect.active(safe=True) or {}
    return dict(replies), sorted(set(workers) - replies.keys())


def _twins(client: redis.Redis, settings: Settings, workers: list[str]) -> list[str]:
    """Node names more than one live process refreshes (see the module docstring)."""
    if not workers:
        return []
    since = time.time() - settings.registry_refresh * REGISTRY_TTL_REFRESHES
    with client.pipeline(transaction=False) as pipe:
        for name in workers:
            pipe.zcount(worker_processes_key(settings.key_prefix, name), since, "+inf")
        counts = pipe.execute()
    return sorted(name for name, count in zip(workers, counts, strict=True) if count > 1)


def _queues(
    client: redis.Redis, settings: Settings, entries: Iterable[WorkerEntry], app: Celery
) -> list[QueueStatus]:
    consumers: dict[str, int] = defaultdict(int)
    tools: dict[str, set[str]] = defaultdict(set)
    for entry in entries:
        for queue in entry.queues:
            consumers[queue] += 1
        for spec in entry.tools:
            tools[spec.queue].add(spec.name)
            own = tool_queue(spec.name, spec.version)
            if own in entry.queues:
                tools[own].add(spec.name)
    policies = settings.policies()
    # Configured queues too: a queue no worker consumes is the one whose calls wait.
    names = set(consumers) | {policies.defaults.queue}
    names |= {policies.for_tool(name).queue for name in policies.tools}
    ordered = sorted(names)
    if settings.broker_is_amqp:
        depths = amqp_queue_depths(app, ordered)
    else:
        depths = queue_depths(client, settings, ordered)
    return [
        QueueStatus(name, depth, consumers.get(name, 0), sorted(tools.get(name, ())))
        for name, depth in zip(ordered, depths, strict=True)
    ]


def queue_depths(client: redis.Redis, settings: Settings, queues: list[str]) -> list[int]:
    """Calls waiting in each of ``queues``, in order (one pipeline of ``LLEN``)."""
    prefix = f"{settings.namespace}:" if settings.namespace else ""
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            for step in PRIORITY_STEPS:
                pipe.llen(f"{prefix}{queue}{Channel.sep}{step}" if step else f"{prefix}{queue}")
        lengths = pipe.execute()
    steps = len(PRIORITY_STEPS)
    return [sum(lengths[i * steps : (i + 1) * steps]) for i in range(len(queues))]


def amqp_queue_depths(app: Celery, queues: list[str]) -> list[int]:
    """Calls waiting in each of ``queues`` on RabbitMQ: the message count of a passive
    ``queue_declare`` (0 for a queue not declared yet); one connection for all."""
    depths = []
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        for queue in queues:
            try:
                ok = channel.queue_declare(broker_queue_name(app, queue), passive=True)
            except conn.channel_errors:  # NOT_FOUND closes the channel
                channel = conn.channel()
                depths.append(0)
            else:
                depths.append(int(ok.message_count))
    return depths


def render(status: FleetStatus, console: Console) -> None:
    """Print ``status`` as rich tables."""
    workers = Table(title=f"Workers online: {len(status.workers)}", title_justify="left")
    for column in ("worker", "pid", "queues", "active", "seen", "tools"):
        workers.add_column(column, overflow="fold")
    for w in status.workers:
        workers.add_row(
            escape(w.name),
            str(w.pid),
            escape(", ".join(w.queues)),
            "?" if w.active is None else str(w.active),
            f"{w.last_seen:g}s ago",
            str(len(w.tools)),
        )
    console.print(workers)
    sandboxes = [w for w in status.workers if w.sandbox_isolation]
    if sandboxes:
        isolation = Table(title="run_python isolation", title_justify="left")
        for column in ("worker", "isolation between calls"):
            isolation.add_column(column, overflow="fold")
        for w in sandboxes:
            level = escape(w.sandbox_isolation or "")
            if "refusing" in level:
                level = f"[red]{level}[/]"
            isolation.add_row(escape(w.name), level)
        console.print(isolation)

    queues = Table(title="Queues", title_justify="left")
    for column in ("queue", "depth", "workers", "tools served"):
        queues.add_column(column, overflow="fold")
    for q in status.queues:
        if q.tools:
            served = escape(", ".join(q.tools))
        elif q.workers:  # consumed, but the routing sends nothing here
            served = "[dim]no tools routed here[/]"
        else:
            served = "[red]none: calls here wait[/]"
        queues.add_row(escape(q.name), str(q.depth), str(q.workers), served)
    console.print(queues)

    routes = Table(title="Tools", title_justify="left")
    for column in ("tool", "version", "queue", "workers"):
        routes.add_column(column, overflow="fold")
    for r in status.routes:
        version = escape(r.version) if r.shown else f"{escape(r.version)} [dim](older calls)[/]"
        routes.add_row(escape(r.tool), version, escape(r.queue), escape(", ".join(r.workers)))
    console.print(routes)

    kinds = Table(title="Worker kinds (what an autoscaler watches)", title_justify="left")
    for column in ("kind", "workers", "waiting", "broker keys"):
        kinds.add_column(column, overflow="fold")
    for k in status.kinds:
        kinds.add_row(escape(k.kind), str(k.workers), str(k.waiting), escape(", ".join(k.keys)))
    console.print(kinds)
    for warning in status.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")

    calls = Table(title=f"In-flight calls: {len(status.in_flight)}", title_justify="left")
    for column in ("tool", "worker", "call", "running"):
        calls.add_column(column, overflow="fold")
    for c in status.in_flight:
        running = "?" if c.running_for is None else f"{c.running_for:g}s"
        calls.add_row(escape(c.tool), escape(c.worker), escape(c.call), running)
    console.print(calls)
    if status.unresponsive:
        console.print(
            f"[yellow]did not answer inspect active:[/] {escape(', '.join(status.unresponsive))}"
        )
    primary = status.primary
    if primary.get("sentinel_master"):
        line = (
            f"Redis primary: {primary.get('address')} (Sentinel master "
            f"{primary['sentinel_master']})"
        )
        if primary.get("changed_at"):
            since = max(time.time() - float(primary["changed_at"]), 0.0)
            line += f"; last failover seen {since:.0f}s ago, from {primary.get('previous')}"
        console.print(escape(line))
    for loss in status.data_losses[:3]:
        noticed = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(loss["at"]))
        console.print(
            f"[red]Redis lost toolfleet's records[/] (noticed {noticed} by the "
            f"{escape(loss['side'])} on {escape(loss['host'])}: {escape(loss['how'])}); "
            "non-idempotent calls published before were answered as may have run: "
            "keep Redis persistent (AOF)"
        )
    for name in status.duplicates:
        console.print(
            f"[red]more than one worker process runs as {escape(name)}[/]: they share one registry "
            "entry and hide each other; give each its own node name (-n)"
        )
    here = socket.gethostname()
    for record in status.placement:
        if record.get("host") != here:
            at = record.get("at")
            ago = f"{max(time.time() - at, 0):.0f}s ago" if isinstance(at, (int, float)) else "?"
            console.print(
                escape(
                    f"orchestrator {record.get('host')}:{record.get('pid')} published its tool "
                    f"placement {ago} (--json for it)"
                )
            )
            continue
        title = escape(f"Tool placement of orchestrator {record.get('host')}:{record.get('pid')}")
        table = Table(title=title, title_justify="left")
        for column in ("tool", "runs", "why"):
            table.add_column(column, overflow="fold")
        for name, row in sorted((record.get("tools") or {}).items()):
            where = "[cyan]workers[/]" if row.get("placement") == "remote" else "here"
            table.add_row(escape(name), where, escape(str(row.get("reason", ""))))
        console.print(table)


def run_status(settings: Settings, *, as_json: bool, timeout: float, console: Console) -> int:
    """Collect and print the status; the exit code (1 when no worker is online)."""
    app = create_app(settings)
    try:
        status = collect(settings, app=app, timeout=timeout)
    finally:
        app.close()
    if as_json:
        # Plain JSON on stdout for scripts (no rich highlighting or wrapping).
        print(json.dumps(status.to_dict(), indent=2))
    else:
        render(status, console)
    return 0 if status.workers else 1
