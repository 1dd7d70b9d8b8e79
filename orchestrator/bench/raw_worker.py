"""The bare Celery app's worker the cost scenario (g) measures toolfleet against.

Light to import (no agent stack): ``toolfleet bench`` spawns it with toolfleet's workers
before it imports the scenarios, so it boots meanwhile.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.bench.fleet import WORKER_LOGLEVEL, BenchFleet
from orchestrator.bench.raw_celery import NOOP, PREFIX_ENV, QUEUE, URL_ENV, create_raw_app
from orchestrator.local import WorkerProcess
from tool_workers.contract.settings import Settings


class RawCeleryWorker(WorkerProcess):
    """A stock ``celery -A orchestrator.bench.raw_celery worker`` (started and stopped by
    its pid, in its own session, as toolfleet's bench workers are).

    Args:
        settings: The scenario's settings (the worker ignores them).
        url: Broker and result backend of the bare app.
        prefix: Its key prefix.
        pool: Celery pool.
        concurrency: Pool size.
        log_file: Where its output goes.
    """

    celery_app = "orchestrator.bench.raw_celery"

    def __init__(
        self,
        settings: Settings,
        *,
        url: str,
        prefix: str,
        pool: str,
        concurrency: int,
        log_file: Path | None = None,
    ) -> None:
        super().__init__(
            settings,
            name=f"bench-raw-{os.getpid()}",
            pool=pool,
            concurrency=concurrency,
            queues=(QUEUE,),
            log_file=log_file,
            extra_env={URL_ENV: url, PREFIX_ENV: prefix},
            loglevel=WORKER_LOGLEVEL,
        )
        self.url = url
        self.prefix = prefix

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the worker has run a ``noop`` (it keeps no registry entry).

        Raises:
            RuntimeError: the worker exited or did not answer within ``timeout`` seconds.
        """
        app = create_raw_app(self.url, self.prefix)
        try:
            result = app.send_task(NOOP, args=("ready",))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(
                        f"raw Celery worker exited with code {self.process.returncode}"
                        + (f"; see {self.log_file}" if self.log_file else "")
                    )
                if result.ready():
                    result.get(timeout=1)
                    return
                time.sleep(0.1)
        finally:
            app.close()
        raise RuntimeError(f"raw Celery worker not ready after {timeout:g} s")

    def pids(self) -> list[int]:
        """The main process and its pool children."""
        return [self.pid, *self.children()] if self.process is not None else []


def raw_worker_for(
    fleet: BenchFleet,
    settings: Settings,
    *,
    pool: str,
    concurrency: int,
    reach: Callable[[str], str] = str,
) -> RawCeleryWorker:
    """The bare Celery app's worker for the scenario of ``settings`` (not started yet).

    Args:
        reach: The URL the worker reaches the server by, from the server's (a proxy's:
            :func:`orchestrator.bench.links.proxied`).

    Raises:
        RuntimeError: the server is not Redis (INFO and the bare app need it), or the
            results go to another server.
    """
    url = fleet.broker_url
    if not url.startswith(("redis://", "rediss://")):
        raise RuntimeError("the cost scenario needs a Redis broker (it reads INFO)")
    if settings.backend_url != url:
        raise RuntimeError("the cost scenario needs results on the broker's server")
    return RawCeleryWorker(
        settings,
        url=reach(url),
        prefix=f"{settings.namespace or 'bench'}-raw:",
        pool=pool,
        concurrency=concurrency,
        log_file=fleet.workdir / "raw-worker.log",
    )
