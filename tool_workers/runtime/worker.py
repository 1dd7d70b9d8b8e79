"""The worker's Celery app: ``celery -A tool_workers worker`` finds ``app`` here.

Settings are read once, here, where the worker process starts. The tool modules named
by ``TOOLFLEET_TOOL_MODULES`` (the built-in toolset when unset) are imported and each
tool becomes a task ``tools.<name>``. Each tool it serves brings its tool queue
(``tool:<name>:<schema version>``), consumed beside the ``-Q`` queues: orchestrators
route calls there, so a call reaches only a worker that serves its tool at the schema
the model was shown. When the worker is ready it publishes the tools it serves (and all
its queues) to the registry and keeps that entry fresh until it shuts down. With
``TOOLFLEET_METRICS_PORT`` set, its main process serves Prometheus metrics
(:mod:`tool_workers.observability.metrics`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery, signals
from celery.concurrency.prefork import TaskPool as PreforkPool
from pydantic import ValidationError

from tool_workers.builtin.sandbox import sandbox_isolation
from tool_workers.celery_ext.amqp_lease import start_worker_lease
from tool_workers.celery_ext.drain import install as install_hand_back
from tool_workers.celery_ext.event_loop import LimitWatchdog, spare_storing_calls
from tool_workers.celery_ext.hand_on import HandOn
from tool_workers.celery_ext.lease import Lease, share_acknowledgements, stop_stale_calls
from tool_workers.celery_ext.redaction import quiet_celery_trace
from tool_workers.celery_ext.soft_limit import mark, share_phases
from tool_workers.celery_ext.transport import install as install_transport
from tool_workers.contract.amqp import plain_queue_name
from tool_workers.contract.broker import create_app, visibility_timeout
from tool_workers.contract.connections import redis_client
from tool_workers.contract.errors import ConfigError, ToolfleetError
from tool_workers.contract.fleet import read_entries
from tool_workers.contract.logs import install_formatters, settings_fields
from tool_workers.contract.models import ToolSpec
from tool_workers.contract.names import tool_queue
from tool_workers.contract.placeholders import refuse_placeholders
from tool_workers.contract.process import make_undumpable
from tool_workers.contract.settings import Settings, settings_error
from tool_workers.observability import metrics, tracing
from tool_workers.runtime.loader import load_tools, tool_sources
from tool_workers.runtime.registry import RegistryPublisher, build_entry, check_names
from tool_workers.runtime.tasks import register_tools

log = logging.getLogger("toolfleet.worker")


def serving(app: Celery, tools: Iterable[ToolSpec]) -> list[ToolSpec]:
    """The tools a worker of ``app`` serves: those its policy routes to a queue the worker
    consumes (``-Q``)."""
    consumed = {plain_queue_name(app, name) for name in app.amqp.queues.consume_from}
    return [spec for spec in tools if spec.queue in consumed]


def _start() -> tuple[Settings, Celery, dict[str, ToolSpec], dict[str, str]]:
    """Settings, the app and its tools; a setting or tool module that cannot work ends
    the process with one line saying why (Celery would bury it under its own traceback
    of every way it tried to find the app). The last item maps each tool that runs code
    to the isolation between its calls."""
    try:
        settings = Settings()
        # Flower runs on this app too (celery -A tool_workers flower) and reads its
        # login from the environment itself.
        refuse_placeholders(settings, os.environ)
        policies = settings.policies()
        # Before the app connects: the worker's Redis transport (bad entries dropped,
        # deliveries held under the lease).
        install_transport()
        app = create_app(settings, policies)
        tools = load_tools(settings)
        if settings.mcp_servers:
            from tool_workers.mcp.tools import hinted_policies

            # MCP tools' annotations stand where the policy file says nothing.
            policies = hinted_policies(policies, tools)
        specs = register_tools(app, tools, settings, policies, tool_sources(tools, settings))
        _check_names(settings, specs.values())
        isolation = {t.name: i for t in tools if (i := sandbox_isolation([t])) is not None}
    except ValidationError as exc:
        raise SystemExit(f"toolfleet: {settings_error(exc)}") from None
    except ToolfleetError as exc:
        raise SystemExit(f"toolfleet: {exc}") from None
    return settings, app, specs, isolation


def _check_names(settings: Settings, specs: Iterable[ToolSpec]) -> None:
    """Refuse (:class:`ConfigError`) to serve a name another kind of worker serves."""
    try:
        client = redis_client(settings.own_redis_url, settings)
        try:
            entries = read_entries(client, settings.key_prefix)
        finally:
            client.close()
    except redis.RedisError as exc:  # the worker cannot reach Redis: it will say so soon
        log.warning("could not read the registry to check tool names: %r", exc)
        return
    check_names(entries, specs, settings.registry_shared_names)


# Before anything else of the worker runs: a process of the worker's user (a run_python
# snippet) cannot read this process's environment (the broker URL and its password) or
# memory through /proc, nor ptrace it. Forked pool processes inherit the mark.
make_undumpable()
settings, app, specs, isolation = _start()
share_phases()  # before the pool forks: its processes inherit the tables
share_acknowledgements()
# A warm shutdown gives back at once the calls fetched and not started.
install_hand_back(app)

_publisher: RegistryPublisher | None = None
_watchdog: LimitWatchdog | None = None
_lease: Lease | None = None


@signals.worker_init.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _start_metrics(**_: Any) -> None:
    # The main process, before the pool starts: the pool processes inherit the metrics.
    try:
        metrics.start(settings)
    except ConfigError as exc:
        # Celery logs and ignores a receiver's Exception (before logging is set up, too):
        # a worker asked for metrics it cannot serve stops instead.
        raise SystemExit(f"toolfleet worker: {exc}") from exc
    # Also before the pool starts: an OpenTelemetry span per call (opentelemetry-api).
    tracing.start()
    # Before the consumer takes its first call: every delivery is held under the lease.
    global _lease
    _lease = start_worker_lease(
        settings, visibility_timeout(settings.policies(), settings.redelivery_margin), app
    )


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _harden_pool_process(**_: Any) -> None:
    # Inherited across fork already; again in case the pool was started another way.
    make_undumpable()


@signals.celeryd_after_setup.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _consume_tool_queues(instance: Any, **_: Any) -> None:
    # After -Q is applied: each tool this worker serves (routed to a queue it consumes)
    # also brings its tool queue, where orchestrators route calls of that tool by default.
    queues = instance.app.amqp.queues
    served = serving(instance.app, specs.values())
    for spec in served:
        name = tool_queue(spec.name, spec.version)
        if name is not None:
            queues.select_add(queues[name])
    # A call of a tool this worker does not serve (at the version asked) is handed on.
    instance.app.conf.toolfleet_hand_on = HandOn(
        settings, {spec.name: spec.version for spec in served}
    )


@signals.worker_ready.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _publish_registry(sender: Any = None, **_: Any) -> None:
    global _publisher, _watchdog
    if isinstance(sender.pool, PreforkPool):
        # Time limits on time even while a network cut holds up the event loop.
        spare_storing_calls(sender.pool)
        _watchdog = LimitWatchdog(sender.pool).start()
    if _lease is not None:
        # Executions of calls handed on (and started) elsewhere while this worker was
        # unreachable are stopped from the consumer loop, where the pool is safe to use.
        sender.timer.call_repeatedly(
            settings.lease_refresh, stop_stale_calls, (_lease, sender.pool)
        )
    queues = [plain_queue_name(sender.app, name) for name in sender.app.amqp.queues.consume_from]
    entry = build_entry(sender.hostname, queues, specs.values(), isolation)
    client = redis_client(settings.own_redis_url, settings)
    _publisher = RegistryPublisher(client, settings.key_prefix, entry, settings.registry_refresh)
    _publisher.start()
    log.info(
        "toolfleet worker %s serves %s on queues %s",
        entry.worker,
        ", ".join(spec.name for spec in entry.tools) or "no tools",
        ", ".join(entry.queues),
    )
    log.info("toolfleet settings", extra={"toolfleet": settings_fields(settings)})


@signals.after_setup_logger.connect  # type: ignore[untyped-decorator]
@signals.after_setup_task_logger.connect  # type: ignore[untyped-decorator]
def _format_logs(logger: logging.Logger, **_: Any) -> None:
    # Celery's handlers, levels and line format stay; TOOLFLEET_LOG_JSON picks JSON lines,
    # and the per-call fields are rendered either way.
    install_formatters(logger, settings)
    quiet_celery_trace()


@signals.worker_shutdown.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _unpublish_registry(**_: Any) -> None:
    if _watchdog is not None:
        _watchdog.stop()
    if _lease is not None:
        _lease.stop()
    if _publisher is not None:
        _publisher.stop()


@signals.task_prerun.connect  # type: ignore[untyped-decorator]  # celery is unannotated
def _call_starts(**_: Any) -> None:
    # A new call: its tool has not run yet (the hard limit applies in full again).
    mark(finished=False)
