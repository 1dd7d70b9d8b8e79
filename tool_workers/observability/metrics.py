"""Prometheus metrics of a worker: its calls by tool and outcome, and how long they ran.

Off unless ``TOOLFLEET_METRICS_PORT`` is set; then the worker's main process serves
``/metrics`` on that port (``pip install 'toolfleet[metrics]'``)::

    toolfleet_worker_calls_total{tool, outcome, worker}
    toolfleet_worker_call_duration_seconds{tool, outcome, worker}   (histogram)
    toolfleet_worker_redis_data_lost_total   losses of toolfleet's records in Redis noticed
                                             (:mod:`tool_workers.contract.epoch`)

``outcome`` is ``success`` or the result's ``error_kind`` (``tool_error``,
``invalid_args``, ``timeout``, ``redelivered``, ...) for a call that returned; ``retry``
for an attempt Celery retries; ``failure`` for an exception that escaped the task; and,
for a call whose pool process could not report: ``timeout`` (the hard time limit killed
it), ``lost`` (the pool process died under it; the call goes back to the queue) and
``cancelled`` (revoked); ``handed_on`` for a call this worker does not serve, passed to
one that does (:mod:`tool_workers.celery_ext.hand_on`). One sample per attempt that
ended on this worker.

Under the prefork pool each pool process writes its samples to files of its own
(prometheus_client's multiprocess mode) in a directory this worker alone uses, and the
main process serves their sum. Pool processes are replaced (hard time limits, crashes,
``--max-tasks-per-child``); at each scrape the main process folds a dead process's
counters and histograms into one archive file per metric type and deletes its files, so
no count is lost or counted twice and the directory does not grow with every
replacement.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from celery import signals

from tool_workers.contract.errors import ConfigError
from tool_workers.contract.failed import ToolCallFailed
from tool_workers.contract.models import ErrorKind
from tool_workers.contract.names import tool_from_task
from tool_workers.contract.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("toolfleet.worker")

CALLS = "toolfleet_worker_calls"
"""Counter of calls by tool and outcome (exposed with the ``_total`` suffix)."""
DURATION = "toolfleet_worker_call_duration_seconds"
"""Histogram of how long an attempt ran on the worker, by tool and outcome."""
LATE = "toolfleet_worker_late_results"
"""Counter of results that came after their call was handed on and answered by another
attempt, kept as late results (exposed with the ``_total`` suffix)."""

DATA_LOST = "toolfleet_worker_redis_data_lost"
"""Counter of losses of Redis data (toolfleet's records) a worker process noticed
(exposed with the ``_total`` suffix)."""

OUTCOMES: tuple[str, ...] = (
    "success",
    *get_args(ErrorKind),
    "retry",
    "failure",
    "lost",
    "handed_on",
)
"""Every value the ``outcome`` label takes."""

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Seconds: from a trivial call to the default 300 s time limit."""

_FOLDED_TYPES = ("counter", "histogram", "summary")
"""Metric file types whose samples add up across processes (a dead one's can be folded)."""


class WorkerMetrics:
    """The worker's metrics and the server that exposes them (one per worker process tree).

    Args:
        directory: The worker's own multiprocess directory (empty when it starts).
    """

    def __init__(self, directory: Path) -> None:
        from prometheus_client import Counter, Histogram

        self.directory = directory
        self._fold_lock = threading.Lock()
        self._started: dict[str, float] = {}
        self._server: Any = None
        self.calls: Counter = Counter(
            CALLS,
            "Tool calls (attempts) that ended on this worker, by outcome.",
            ["tool", "outcome", "worker"],
            registry=None,
        )
        self.duration: Histogram = Histogram(
            DURATION,
            "Seconds an attempt ran on this worker, by outcome.",
            ["tool", "outcome", "worker"],
            buckets=DURATION_BUCKETS,
            registry=None,
        )
        self.late_results: Counter = Counter(
            LATE,
            "Results that came after their call was answered by another attempt (kept as "
            "late results), by tool.",
            ["tool", "worker"],
            registry=None,
        )
        self.redis_data_lost: Counter = Counter(
            DATA_LOST,
            "Losses of toolfleet's records in Redis (a restart without persistence, a "
            "FLUSHALL, a failover to a replica behind) this worker noticed.",
            registry=None,
        )

    def data_lost(self) -> None:
        """Count one loss of Redis data this process noticed."""
        self.redis_data_lost.inc()

    def record(self, tool: str, outcome: str, worker: str, seconds: float | None) -> None:
        """Count one attempt (and its duration, when known)."""
        self.calls.labels(tool, outcome, worker).inc()
        if seconds is not None:
            self.duration.labels(tool, outcome, worker).observe(max(seconds, 0.0))

    def late(self, tool: str, worker: str) -> None:
        """Count one late result (its store was refused: another attempt answered)."""
        self.late_results.labels(tool, worker).inc()

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` from this (the main) process, in a thread."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_FoldingCollector(self))
        self._server, _ = start_http_server(port, addr=host, registry=registry)

    def close_inherited_socket(self) -> None:
        """In a forked pool process: drop the copy of the main process's listening socket."""
        if self._server is not None:
            self._server.socket.close()
            self._server = None

    def shutdown(self) -> None:
        """Stop serving and remove the directory (the main process, at worker shutdown)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def fold_dead(self) -> int:
        """Fold the files of processes that exited into the archive; returns how many."""
        with self._fold_lock:
            return self._fold()

    def collect(self) -> Iterable[Metric]:
        """Every process's samples, summed (after folding the dead ones)."""
        from prometheus_client import multiprocess

        # prometheus_client's multiprocess helpers are unannotated.
        collector: Any = multiprocess.MultiProcessCollector(None, path=str(self.directory))  # type: ignore[no-untyped-call]
        # Folding and reading under one lock: a concurrent scrape never sees a dead
        # process's samples both in its file and in the archive.
        with self._fold_lock:
            self._fold()
            return list(collector.collect())

    def _fold(self) -> int:
        from prometheus_client import mmap_dict, multiprocess

        # prometheus_client's file helpers are unannotated.
        mmaped: Any = mmap_dict.MmapedDict
        mark_process_dead: Any = multiprocess.mark_process_dead

        folded = 0
        for path in sorted(self.directory.glob("*.db")):
            kind, _, owner = path.stem.partition("_")
            pid = owner.rpartition("_")[2]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            if kind in _FOLDED_TYPES:
                archive = mmaped(str(self.directory / f"{kind}_archive.db"))
                try:
                    for key, value, _ts, _pos in mmaped.read_all_values_from_file(str(path)):
                        current, _ = archive.read_value(key)
                        archive.write_value(key, current + value, 0.0)
                finally:
                    archive.close()
                path.unlink()
            else:  # gauges: the live ones go with their process, the others stay
                mark_process_dead(int(pid), str(self.directory))
            folded += 1
        return folded

    # -- Celery hooks ----------------------------------------------------------------------

    def task_started(self, task_id: str) -> None:
        """A pool process starts a task (``task_prerun``)."""
        self._started[task_id] = time.perf_counter()

    def task_ended(self, task: Any, task_id: str, state: str | None, retval: Any) -> None:
        """A pool process ends a task (``task_postrun``): count its outcome."""
        started = self._started.pop(task_id, None)
        tool = tool_from_task(str(task.name))
        if tool is None:
            return
        outcome = returned_outcome(state, retval)
        if outcome is None:
            return
        seconds = time.perf_counter() - started if started is not None else None
        self.record(tool, outcome, task.request.hostname or "", seconds)

    def unreported(self, name: str, hostname: str, outcome: str, time_start: float | None) -> None:
        """The main process saw a call end that its pool process could not report."""
        tool = tool_from_task(name)
        if tool is None:
            return
        seconds = time.time() - time_start if time_start else None
        self.record(tool, outcome, hostname, seconds)


def returned_outcome(state: str | None, retval: Any) -> str | None:
    """The outcome of a task that ended in its pool process, from its state and value.

    ``None`` when the task did not end at all: a ``SystemExit`` (the process is being
    terminated, e.g. by a revocation) leaves no state, and the main process counts it.
    """
    if state is None:
        return None
    if state == "RETRY":
        return "retry"
    if state == "FAILURE" and isinstance(retval, ToolCallFailed):
        retval = retval.result  # an error result, raised so that Flower lists it failed
        state = "SUCCESS"
    if state != "SUCCESS" or not isinstance(retval, dict):
        return "failure"
    kind = retval.get("error_kind")
    if kind is None:
        return "success"
    return str(kind) if kind in OUTCOMES else "failure"


def failure_outcome(exc: BaseException, cancelled: bool) -> str | None:
    """The outcome of a failure the main process handles, or ``None`` if counted elsewhere.

    Args:
        exc: What the pool reported for the call.
        cancelled: The call was revoked or cancelled (its process died of that).
    """
    from billiard.einfo import ExceptionWithTraceback
    from billiard.exceptions import TimeLimitExceeded, WorkerLostError

    if isinstance(exc, ExceptionWithTraceback):
        exc = exc.exc
    if isinstance(exc, TimeLimitExceeded):
        return "timeout"
    if isinstance(exc, WorkerLostError):
        return "lost"
    if isinstance(exc, (SystemExit, KeyboardInterrupt)) and not cancelled:
        return "lost"
    # A revocation is counted by task_revoked; anything else by the pool process itself.
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid was reused by another user's process
        return True
    return True


class _FoldingCollector:
    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics.collect()


_active: WorkerMetrics | None = None


def active() -> WorkerMetrics | None:
    """This process's worker metrics, when they are on."""
    return _active


def start(settings: Settings) -> WorkerMetrics | None:
    """Turn the metrics on in a worker's main process, before its pool starts.

    Creates the worker's multiprocess directory, points prometheus_client at it (the
    pool processes inherit that), starts the server and connects the Celery signals.

    Raises:
        ConfigError: ``TOOLFLEET_METRICS_PORT`` is set but prometheus-client is missing,
            or the port cannot be bound.
    """
    global _active
    if settings.metrics_port is None:
        return None
    base = settings.metrics_dir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="toolfleet-metrics-", dir=base))
    # prometheus_client picks its value class from this variable when it is imported.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    try:
        from prometheus_client import values
    except ImportError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise ConfigError(
            "TOOLFLEET_METRICS_PORT is set but prometheus-client is not installed: "
            "pip install 'toolfleet[metrics]'"
        ) from exc
    # Also when something imported prometheus_client before the variable was set.
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    metrics = WorkerMetrics(directory)
    try:
        metrics.serve(settings.metrics_host, settings.metrics_port)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise ConfigError(
            f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: {exc}"
        ) from exc
    _active = metrics
    signals.task_prerun.connect(_prerun, weak=False)
    signals.task_postrun.connect(_postrun, weak=False)
    signals.task_revoked.connect(_revoked, weak=False)
    signals.worker_process_init.connect(_pool_process_init, weak=False)
    signals.worker_shutdown.connect(_shutdown, weak=False)
    log.info("worker metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return metrics


def _prerun(task_id: str = "", **_: Any) -> None:
    if _active is not None:
        _active.task_started(task_id)


def _postrun(
    task: Any = None, task_id: str = "", state: str | None = None, retval: Any = None, **_: Any
) -> None:
    if _active is not None and task is not None:
        _active.task_ended(task, task_id, state, retval)


def _revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if _active is not None and sender is not None:
        hostname = getattr(request, "hostname", None) or ""
        _active.unreported(str(sender.name), hostname, "cancelled", None)


def _pool_process_init(**_: Any) -> None:
    if _active is not None:
        _active.close_inherited_socket()


def _shutdown(**_: Any) -> None:
    if _active is not None:
        _active.shutdown()
