"""Helpers of the HTTP-service tests: ``toolfleet serve`` in a subprocess, a prefork fleet.

The server is the real CLI (``python -m orchestrator.cli serve``) on a free loopback port,
with the fleet's settings, a token, and the test model chosen by ``TOOLFLEET_MODEL``.
It is stopped by its own pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import pytest
import redis

from orchestrator.local import WorkerProcess, settings_env
from tests.support.fleet import REPO, fleet_settings, worker_env
from tool_workers.contract.settings import Settings

T = TypeVar("T")

TEST_MODEL = "tests.server_models:directed"
"""The model the tests' servers run (see tests/server_models.py)."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine of the async SDK client to completion."""
    return asyncio.run(coro)


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """``toolfleet serve`` in a subprocess.

    Args:
        settings: The fleet's settings (with the service's own: tokens, database, limits).
        workdir: Its working directory (the SQLite checkpoints land here).
        log_file: Where its output goes.
        extra_env: More environment variables.
        args: More arguments of ``toolfleet serve`` (``--config``).
        open_files: The server's open-file limit (soft and hard; default: this
            process's), as a container's 1024 would be.
    """

    def __init__(
        self,
        settings: Settings,
        workdir: Path,
        log_file: Path,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        open_files: int | None = None,
    ) -> None:
        self.settings = settings
        self.workdir = workdir
        self.log_file = log_file
        self.extra_env = extra_env or {}
        self.args = args
        self.open_files = open_files
        self.port = 0
        self.returncode: int | None = None
        """How the process ended, once :meth:`stop` ended it (``-9``: it was killed)."""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        """Everything the server wrote so far."""
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def command(self) -> list[str]:
        """The server's command line (``self.port`` is chosen by then)."""
        return [
            *(sys.executable, "-m", "orchestrator.cli", "serve"),
            *("--port", str(self.port), *self.args),
        ]

    def start(self, timeout: float = 60.0) -> ServerProcess:
        """Start the server and wait until it answers ``/ok``."""
        self.port = free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TOOLFLEET_", "LANGSMITH_", "LANGCHAIN_"))
        }
        env.update(settings_env(self.settings))
        env.update({"PYTHONPATH": str(REPO), **worker_env(self.settings), **self.extra_env})
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self._limit_files if self.open_files else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"server exited ({self._proc.returncode}):\n{self.log()[-4000:]}"
                )
            try:
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not answer within {timeout:g} s:\n{self.log()[-4000:]}")

    def _limit_files(self) -> None:
        assert self.open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the server (its own pid), then SIGKILL it after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        self.returncode = proc.returncode


def start_server(
    settings: Settings,
    workdir: Path,
    name: str,
    args: tuple[str, ...] = (),
    **overrides: Any,
) -> ServerProcess:
    """A started server for ``settings`` with the test model and a fresh token
    (``args``: more arguments of ``toolfleet serve``)."""
    values: dict[str, Any] = {
        "api_tokens": (f"tft-token-{uuid.uuid4().hex}",),
        "model": TEST_MODEL,
        "checkpoint_path": workdir / f"{name}.sqlite",
        **overrides,
    }
    server = ServerProcess(
        settings.model_copy(update=values), workdir, workdir / f"{name}.log", args=args
    )
    return server.start()


@pytest.fixture(scope="module")
def database_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL URL whose search path is a fresh schema (dropped afterwards)."""
    import psycopg  # the postgres extra's: the server extra's tests import this module

    schema = f"tft_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in postgres_url else "?"
    yield f"{postgres_url}{separator}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="module")
def prefork_fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A fleet of one prefork worker in a namespace of its own: cancelling a run can
    terminate its tool tasks there (the threads pool cannot)."""
    workdir = tmp_path_factory.mktemp("server-fleet")
    settings = fleet_settings(redis_url, workdir)
    worker = WorkerProcess(
        settings,
        name=f"tf-server-{uuid.uuid4().hex[:6]}",
        pool="prefork",
        concurrency=3,
        queues=("tools", "prefork"),
        log_file=workdir / "worker.log",
        extra_env=worker_env(settings),
    )
    worker.start()
    try:
        worker.wait_ready()
        yield settings
    finally:
        worker.stop(grace=5)


def wait_for_states(
    settings: Settings, task_ids: list[str], state: str, timeout: float = 15.0
) -> dict[str, str | None]:
    """Poll the Celery states stored for ``task_ids`` until all are ``state``; the last read.

    Reads the result keys with a client of its own (closed after), not through a Celery
    app whose backend connection would outlive the test.
    """
    from tool_workers.contract.broker import create_app

    app = create_app(settings)
    client = redis.Redis.from_url(settings.backend_url)
    states: dict[str, str | None] = {}
    deadline = time.monotonic() + timeout
    try:
        while True:
            raws = client.mget([app.backend.get_key_for_task(t) for t in task_ids])
            states = {
                t: None if raw is None else str(json.loads(raw)["status"])
                for t, raw in zip(task_ids, raws, strict=True)
            }
            if set(states.values()) == {state} or time.monotonic() > deadline:
                return states
            time.sleep(0.2)
    finally:
        client.close()
