"""A toolfleet on a test network: Redis on one host, each worker on a host of its own.

The test process plays the orchestrator from the root namespace. Workers serve the tools
of :mod:`tests.support.net_tools`, whose side effects land in a file, so they are counted
right whatever the network does. Helpers measure what the fault tests check: how soon a
worker answers a ping, takes a new call, finishes a warm shutdown.

With ``broker="rabbitmq"`` the calls travel through the machine's RabbitMQ (Redis on its
host keeps results and state). The server listens on the root namespace's loopback
only, so a forwarding proxy in the test process listens on the root's address on the test
subnet: a host whose link is cut then goes silent to RabbitMQ exactly as a vanished
machine would (no FIN, no RST: RabbitMQ notices by its heartbeat only), and one killed
closes its connections as a machine's kernel would.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from celery import Celery
from kombu import pools
from kombu.utils.collections import eqhash

from orchestrator.bench.delay_proxy import DelayProxy
from tests.support.amqp import amqp_test_url, delete_namespace, tool_queues_of
from tests.support.fleet import fleet_settings, worker_env
from tests.support.hosts import HostRedis, HostWorker
from tests.support.net_tools import read_effects
from tests.support.netns import TestNet
from tool_workers.contract.broker import create_app
from tool_workers.contract.settings import Settings

NET_POLICY = Path(__file__).resolve().parent.parent / "faults" / "net_policy.toml"


class NetFleet:
    """Redis and workers on ``net``; :meth:`close` stops every worker (the network's
    owner removes the hosts)."""

    def __init__(
        self, net: TestNet, workdir: Path, broker: str = "redis", **overrides: Any
    ) -> None:
        self.net = net
        self.workdir = workdir
        self.broker = broker
        self.effects_file = workdir / "effects.log"
        self.redis = HostRedis(net.add_host("redis"), workdir / "redis.log").start()
        self.amqp_proxy: DelayProxy | None = None
        values: dict[str, Any] = {
            "tool_modules": ("tests.support.net_tools",),
            "config": NET_POLICY,
            "redelivery_margin": 2.0,
        }
        if broker == "rabbitmq":
            values.update(self._through_rabbitmq())
        values.update(overrides)
        self.settings: Settings = fleet_settings(self.redis.url, workdir, **values)
        self.workers: list[HostWorker] = []
        self._app: Celery | None = None

    def _through_rabbitmq(self) -> dict[str, Any]:
        """Settings for RabbitMQ as the broker, reached through a proxy on the test subnet."""
        url = amqp_test_url()
        if not url:
            raise RuntimeError("a RabbitMQ case ran with no RabbitMQ server answering")
        parts = urlsplit(url)
        self.amqp_proxy = DelayProxy(
            parts.hostname or "127.0.0.1", parts.port or 5672, 0.0, listen_host=self.net.gateway
        ).start()
        login = f"{parts.username or 'guest'}:{parts.password or 'guest'}@"
        netloc = f"{login}{self.net.gateway}:{self.amqp_proxy.port}"
        broker_url = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        return {"broker_url": broker_url, "result_backend": self.redis.url}

    @property
    def app(self) -> Celery:
        """A Celery app of the test process (the orchestrator's side), for control calls."""
        if self._app is None:
            self._app = create_app(self.settings)
        return self._app

    def start_worker(self, name: str, **kwargs: Any) -> HostWorker:
        """Start a worker on a new host ``name`` and wait until it serves."""
        host = self.net.add_host(name)
        env = {
            **worker_env(self.settings),
            "TOOLFLEET_TEST_EFFECTS_FILE": str(self.effects_file),
            **kwargs.pop("extra_env", {}),
        }
        kwargs.setdefault("queues", ("tools",))
        log = self.workdir / f"worker-{name}.log"
        worker = HostWorker(
            host, self.settings, name=f"tf-{name}-{uuid.uuid4().hex[:4]}", log_file=log,
            extra_env=env, **kwargs,
        )  # fmt: skip
        self.workers.append(worker)
        worker.start()
        try:
            worker.wait_ready(timeout=60)
        except RuntimeError:
            print(log.read_text(errors="replace")[-4000:])
            raise
        return worker

    def effects(self, key: str) -> list[str]:
        """The recorded events (``start``, ``end``, ``stopped``) of the call ``key``."""
        return [event for event, k, _, _ in read_effects(self.effects_file) if k == key]

    def effect_times(self, key: str) -> dict[str, float]:
        """Unix time of each recorded event of the call ``key`` (the last of each kind)."""
        return {event: at for event, k, _, at in read_effects(self.effects_file) if k == key}

    def seconds_to_pong(self, worker: HostWorker, within: float = 120.0) -> float:
        """Seconds until ``worker`` answers a control ping (at most ``within``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < within:
            with contextlib.suppress(Exception):
                if self.app.control.ping(destination=[worker.hostname], timeout=0.5):
                    return time.monotonic() - t0
            time.sleep(0.2)
        raise AssertionError(f"{worker.hostname} did not answer a ping within {within:g} s")

    def warm_shutdown(self, worker: HostWorker, within: float = 60.0) -> float:
        """SIGTERM ``worker``; seconds until it exited (raises if not within ``within``)."""
        assert worker.process is not None
        t0 = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        try:
            worker.process.wait(timeout=within)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{worker.hostname} did not shut down within {within:g} s"
            ) from exc
        return time.monotonic() - t0

    def close(self) -> None:
        """Stop every worker (SIGKILL after a short grace) and close the control app."""
        for worker in self.workers:
            worker.stop(grace=5)
        if self._app is not None:
            close_broker_pools(self._app)
            self._app.close()
        if self.amqp_proxy is not None:
            self.amqp_proxy.close()
            url = amqp_test_url()
            if url:  # this fleet's queues and exchanges on the shared server
                queues = ("tools", *tool_queues_of("tests.support.net_tools"))
                delete_namespace(url, self.settings.namespace, queues)


def close_broker_pools(app: Celery) -> None:
    """Close kombu's process-wide pools for ``app``'s broker, and forget them.

    Celery's control broadcasts (pings, revocations) publish through them, whatever
    connection they are given. Their Redis host goes away with the test, so their
    sockets are closed here rather than left for the garbage collector.
    """
    connection = app.connection_for_write()
    for group in (pools.producers, pools.connections):
        if eqhash(connection) in group:
            pool = group[connection]
            del group[connection]
            pool.force_close_all()
    connection.release()
