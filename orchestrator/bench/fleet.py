"""The fleet a benchmark run measures: one server, workers per scenario group.

By default an embedded server (:class:`~orchestrator.local.EmbeddedRedis`) that lives
for the run; with ``use_settings`` the broker the ``TOOLFLEET_*`` settings name. Each
scenario group gets its own namespace (its own queues and keys), so its workers see only
its calls; on a shared broker the run deletes its keys at the end. Workers are stock
``celery -A tool_workers worker`` processes serving the built-in toolset, started and
stopped by their own pids.

This module imports no agent stack (LangChain, LangGraph): the run spawns its workers
first, and they boot while the orchestrator imports it.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from orchestrator.bench.measure import cpu_seconds
from orchestrator.local import EmbeddedRedis, WorkerProcess, delete_keys
from tool_workers.contract.settings import Settings

if TYPE_CHECKING:
    from orchestrator.dispatch.dispatcher import CeleryDispatcher

WORKER_LOGLEVEL = "WARNING"
"""Bench workers log warnings only: a line per task would be part of what is measured."""


class BenchFleet:
    """Starts and stops what a benchmark run needs.

    Args:
        workdir: Worker logs and the workspace root go here.
        use_settings: Use the broker the ``TOOLFLEET_*`` settings name instead of an
            embedded server.
    """

    def __init__(self, workdir: Path, *, use_settings: bool = False) -> None:
        self.workdir = workdir
        self.use_settings = use_settings
        self.run_id = uuid.uuid4().hex[:8]
        self.server: EmbeddedRedis | None = None
        self.base: Settings | None = None
        self.workers: list[WorkerProcess] = []
        self.others: list[WorkerProcess] = []
        """Worker processes of other apps (raw Celery's) to stop with the fleet; their CPU
        is not the fleet's."""
        self.dispatchers: list[CeleryDispatcher] = []
        self._server_pid = 0

    def start(self) -> BenchFleet:
        """Start the embedded server (unless the settings' broker is used)."""
        workspace = self.workdir / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        overrides: dict[str, Any] = {"workspace_root": workspace, "registry_refresh": 2.0}
        if self.use_settings:
            self.base = Settings(**overrides)
        else:
            self.server = EmbeddedRedis().start()
            self.base = Settings(broker_url=self.server.url, **overrides)
            client = redis.Redis.from_url(self.server.url)
            try:
                self._server_pid = int(client.info("server")["process_id"])
            finally:
                client.close()
        return self

    @property
    def broker_url(self) -> str:
        """URL of the broker the run uses."""
        assert self.base is not None, "fleet not started"
        return self.base.broker_url

    def settings(self, group: str) -> Settings:
        """Settings of a scenario group: the run's broker, the group's own namespace."""
        assert self.base is not None, "fleet not started"
        return self.base.model_copy(update={"namespace": f"bench-{self.run_id}-{group}"})

    def start_workers(
        self, settings: Settings, count: int, *, pool: str = "threads", concurrency: int = 4
    ) -> list[WorkerProcess]:
        """Start ``count`` workers for ``settings`` and wait until each serves its tools.

        Raises:
            RuntimeError: a worker exited or was not ready in time (its log is named).
        """
        started = self.spawn_workers(settings, count, pool=pool, concurrency=concurrency)
        for worker in started:
            worker.wait_ready(timeout=90)
        return started

    def spawn_workers(
        self, settings: Settings, count: int, *, pool: str = "threads", concurrency: int = 4
    ) -> list[WorkerProcess]:
        """Start ``count`` worker processes for ``settings`` and return at once (they boot
        meanwhile; ``wait_ready`` each before use)."""
        started = []
        for _ in range(count):
            index = len(self.workers)
            worker = WorkerProcess(
                settings,
                name=f"bench-{index}",
                pool=pool,
                concurrency=concurrency,
                log_file=self.workdir / f"worker-{index}.log",
                loglevel=WORKER_LOGLEVEL,
            )
            self.workers.append(worker)
            started.append(worker.start())
        return started

    def dispatcher(self, settings: Settings) -> CeleryDispatcher:
        """The process-wide dispatcher of ``settings`` (remembered for the leak check)."""
        from orchestrator.dispatch.fleet import dispatcher_for

        dispatcher = dispatcher_for(settings=settings)
        if dispatcher not in self.dispatchers:
            self.dispatchers.append(dispatcher)
        return dispatcher

    def stop_workers(self, workers: Sequence[WorkerProcess], *, grace: float = 10.0) -> None:
        """Stop these workers, all at once (warm shutdown, then SIGKILL of their own
        session after ``grace`` seconds; at once with ``grace`` 0)."""
        if workers:
            with ThreadPoolExecutor(len(workers), thread_name_prefix="bench-stop") as pool:
                list(pool.map(lambda worker: worker.stop(grace=grace), workers))
        for worker in workers:
            if worker in self.workers:
                self.workers.remove(worker)

    def stop_runs(self) -> None:
        """End every run still going on this fleet's dispatchers (a scenario past its time
        bound): they are closed, so a run waiting on one ends with a cancellation, and
        forgotten; :meth:`dispatcher` makes new ones."""
        if self.dispatchers:
            from orchestrator.dispatch.fleet import close_all

            close_all()
        self.dispatchers.clear()

    def close(self) -> None:
        """Stop every worker and the server this fleet started; drop the run's keys.

        The workers are killed at once (their sessions, SIGKILL): a finished run has no
        call in flight, so a warm shutdown (a second or two each) would only keep the
        command waiting, and whatever they leave on a shared server is under the run's
        namespace, whose keys are dropped here.
        """
        self.stop_runs()
        self.stop_workers([*self.workers, *self.others], grace=0)
        self.others.clear()
        if self.server is not None:
            self.server.stop()
            self.server = None
        elif self.base is not None:
            delete_keys(self.base.broker_url, f"bench-{self.run_id}-*")

    def cpu_times(self) -> dict[str, float]:
        """CPU seconds used so far by this process, the running workers and the server.

        Read from ``/proc``: a server on another host counts 0.
        """
        workers = [pid for w in self.workers for pid in (w.pid, *w.children())]
        return {
            "orchestrator": cpu_seconds(os.getpid()),
            "workers": sum(cpu_seconds(pid) for pid in workers),
            "server": cpu_seconds(self._server_pid) if self._server_pid else 0.0,
        }

    def server_version(self) -> str:
        """``redis_version`` (and ``valkey_version``) the broker reports."""
        client = redis.Redis.from_url(self.broker_url)
        try:
            info = client.info("server")
        finally:
            client.close()
        name = "valkey" if "valkey_version" in info else "redis"
        return f"{name} {info.get('valkey_version') or info.get('redis_version', '?')}"

    def __enter__(self) -> BenchFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def machine_info() -> dict[str, Any]:
    """The machine and software a run measured: cores, RAM, CPU, Python, versions, date."""
    info: dict[str, Any] = {
        "cores": os.cpu_count() or 0,
        "ram_gib": round(
            int((_proc_field("/proc/meminfo", "MemTotal") or "0 kB").split()[0]) / 2**20, 1
        ),
        "cpu": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "?",
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": load_average(),
    }
    for dist in ("toolfleet", "celery", "kombu", "redis", "langgraph", "langchain"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = "?"
    return info


def load_average() -> float:
    """The 1-minute load average (other work on the machine skews every number)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def _proc_field(path: str, name: str) -> str | None:
    """The value of the first ``name: value`` line of a /proc file (``None``: none)."""
    try:
        with open(path) as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None
