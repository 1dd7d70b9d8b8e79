"""Redis loses its data mid-run: no non-idempotent call runs twice, and the run ends.

Each test starts its own Redis server(s) (never the machine's shared one): a server
without persistence restarted, a ``FLUSHALL``, or a replica whose link to the primary
was cut, promoted and put in the primary's place. Side effects are counted outside
Redis, in a file each execution appends a line to (:mod:`tests.ledger_tools`).
"""

from __future__ import annotations

import contextlib
import json
import threading
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
from tool_workers.contract.epoch import epoch_key, read_epoch, read_losses
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(240)

LOSS_POLICY = REPO / "tests" / "faults" / "loss_policy.toml"
TIME_LIMIT = 8.0
"""The tools' time limit (loss_policy.toml)."""
MARGIN = 12.0
"""Seconds past the time limit a run may take after the loss: the orchestrator's check
of its calls (5 s) and an idempotent call's second run."""
SENTINEL = "tft-loss-sentinel"


def _link_up(client: redis.Redis) -> bool:
    info = client.info("replication")
    return info.get("master_link_status") == "up"


@contextlib.contextmanager
def losing_redis(
    scenario: str, key_prefix: str
) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A Redis URL for the fleet, what to do before the run, and the loss to inflict
    on it mid-run."""
    if scenario in ("restart", "flushall"):
        with EmbeddedRedis() as server:  # no data dir, no AOF: a restart loses everything

            def lose() -> None:
                if scenario == "restart":
                    server.restart(down_for=0.5)
                else:
                    client = redis.Redis.from_url(server.url)
                    try:
                        client.flushall()
                    finally:
                        client.close()

            yield server.url, lambda: None, lose
        return
    # A primary, and a replica that follows it through a proxy whose cut stops the
    # replication; the fleet reaches the primary through another proxy, retargeted to
    # the replica when it is promoted.
    with (
        EmbeddedRedis() as primary,
        EmbeddedRedis() as replica,
        CutProxy("127.0.0.1", _port(primary.url)) as link,
        CutProxy("127.0.0.1", _port(primary.url)) as front,
    ):
        replica_client = redis.Redis.from_url(replica.url)
        host, port = link.url_host.rsplit(":", 1)
        replica_client.replicaof(host, int(port))
        wait_until(lambda: _link_up(replica_client), 20, "the replica's link")

        def before() -> None:
            # The replica has what was written so far (the registry, the epoch); what
            # the run writes next never reaches it.
            primary_client = redis.Redis.from_url(primary.url)
            try:
                primary_client.set(SENTINEL + "-copied", "1")
                wait_until(
                    lambda: (
                        replica_client.get(SENTINEL + "-copied") is not None
                        and replica_client.get(epoch_key(key_prefix)) is not None
                    ),
                    10,
                    "the replica's copy",
                )
            finally:
                primary_client.close()
            link.cut()

        def lose() -> None:
            replica_client.replicaof("NO", "ONE")
            front.retarget("127.0.0.1", _port(replica.url))
            primary.stop()

        url = f"redis://{front.url_host}/0"
        try:
            yield url, before, lose
        finally:
            replica_client.close()
        return


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def _pid_of(ledger: Path, tag: str) -> int | None:
    """The process whose execution of ``tag`` the ledger noted first."""
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            _kind, noted, pid = line.split()
            if noted == tag:
                return int(pid)
    return None


def run_through_loss(
    scenario: str,
    mode: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    *,
    calls_each: int = 3,
    seconds: float = 3.0,
) -> dict[str, Any]:
    """A fan-out of ``calls_each`` non-idempotent and idempotent calls, Redis losing its
    data once they all started; what came of it."""
    ledger = tmp_path / "ledger.txt"
    namespace = make_settings().namespace
    with losing_redis(scenario, make_settings(namespace=namespace).key_prefix) as (
        url,
        before,
        lose,
    ):
        settings = make_settings(
            broker_url=url,
            namespace=namespace,
            config=LOSS_POLICY,
            redelivery_margin=2.0,
            tool_modules=("tests.ledger_tools",),
        )
        env = {"TOOLFLEET_TEST_LEDGER": str(ledger)}
        suffix = settings.namespace.rsplit("-", 1)[-1]
        workers = [
            start_worker(
                settings,
                pool="threads",
                concurrency=12,
                name=f"tf-loss-{w}-{suffix}",
                extra_env=env,
            )
            for w in "ab"
        ]
        try:
            outcome = _fan_out(settings, mode, url, before, lose, ledger, calls_each, seconds)
        finally:
            for worker in workers:
                worker.stop(grace=5)
    return outcome


def _fan_out(
    settings: Settings,
    mode: str,
    url: str,
    before: Callable[[], None],
    lose: Callable[[], None],
    ledger: Path,
    calls_each: int,
    seconds: float,
) -> dict[str, Any]:
    with closing(dispatcher_for(settings=settings)) as dispatcher:
        direct = redis.Redis.from_url(url)
        # A fleet that ran before: the epoch of its records exists (and was replicated).
        read_epoch(direct, settings.key_prefix)
        tools = discover_tools(
            dispatcher=dispatcher, require=["ledger_charge", "ledger_touch"], wait=15
        )
        before()
        direct.set(SENTINEL, "1")  # written after the replica's link was cut
        calls = [("ledger_charge", {"seconds": seconds, "tag": f"c{i}"}) for i in range(calls_each)]
        calls += [("ledger_touch", {"seconds": seconds, "tag": f"t{i}"}) for i in range(calls_each)]
        agent = create_agent(
            one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
        )
        # Every call at once (a sync run's thread pool runs 6 by default).
        runner, outcome = run_in_thread(agent, mode, {"max_concurrency": 2 * calls_each})
        wait_until(lambda: started_calls(settings) == 2 * calls_each, 30, "the start of every call")
        time.sleep(seconds / 3)
        lost_at = time.monotonic()
        lose()
        direct.close()
        direct = redis.Redis.from_url(url)
        assert direct.get(SENTINEL) is None, "the scenario did not lose Redis's data"
        runner.join(timeout=TIME_LIMIT + MARGIN + 30)
        outcome["took"] = time.monotonic() - lost_at
        app = create_app(settings)
        try:
            # A second run of a call would still be going: wait until the workers are idle.
            wait_until(lambda: workers_idle(app), 30, "idle workers")
        finally:
            app.close()
        outcome["runs"] = ledger_runs(ledger)
        outcome["losses"] = read_losses(direct, settings.key_prefix)
        outcome["status"] = collect(settings, timeout=1.0)
        outcome["orchestrator_noticed"] = dispatcher.epochs.losses
        direct.close()
        assert not runner.is_alive(), "the run hangs after Redis lost its data"
        return outcome


def check(outcome: dict[str, Any], calls_each: int) -> None:
    """No non-idempotent call ran twice; every call answered; the run ended in time."""
    assert "error" not in outcome, repr(outcome.get("error"))
    messages = [m for m in outcome["state"]["messages"] if isinstance(m, ToolMessage)]
    assert len(messages) == 2 * calls_each, [m.content for m in messages]
    runs = outcome["runs"]
    print(
        f"charge runs {dict(runs['charge'])}, touch runs {dict(runs['touch'])}, "
        f"{len(messages)} ToolMessages ({sum(m.status == 'error' for m in messages)} errors), "
        f"ended {outcome['took']:.1f} s after the loss; noticed: {outcome['losses']}"
    )
    assert all(n == 1 for n in runs["charge"].values()), runs["charge"]
    assert len(runs["charge"]) <= calls_each
    assert set(runs["touch"]) == {f"t{i}" for i in range(calls_each)}, runs["touch"]
    for message in messages:
        if message.status == "error":
            assert "may have partially run" in str(message.content), message.content
    assert outcome["took"] <= TIME_LIMIT + MARGIN, outcome["took"]
    assert outcome["losses"], "the loss was not noted"
    assert outcome["status"].data_losses, "toolfleet status does not show the loss"
    assert outcome["orchestrator_noticed"] == 1, outcome["orchestrator_noticed"]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", ["restart", "flushall", "replica"])
def test_no_second_run_after_redis_lost_its_data(
    scenario: str,
    mode: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Given non-idempotent and idempotent calls running, when Redis loses its data
    (a restart without persistence, FLUSHALL, a replica promoted while behind), then no
    non-idempotent call runs a second time, every call ends in a ToolMessage (an answer,
    or "may have partially run"), the run ends within the time limit plus a margin,
    and the loss is noticed and shown by ``toolfleet status``."""
    outcome = run_through_loss(scenario, mode, make_settings, start_worker, tmp_path)
    check(outcome, 3)


@pytest.mark.soak
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", ["restart", "flushall", "replica"])
def test_a_wide_fan_out_survives_repeated_losses_of_redis_data(
    scenario: str,
    mode: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """The measurement of the issue, three times over: 10 non-idempotent and 10
    idempotent calls of 6 s, Redis losing its data once they all started."""
    for round_ in range(3):
        workdir = tmp_path / f"round-{round_}"
        workdir.mkdir()
        outcome = run_through_loss(
            scenario, mode, make_settings, start_worker, workdir, calls_each=10, seconds=6.0
        )
        check(outcome, 10)


def test_a_redelivery_to_another_worker_after_a_loss_is_refused(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    amqp_url: str,
    tmp_path: Path,
) -> None:
    """Given calls on RabbitMQ (their messages outlive Redis's data), when Redis is
    flushed and the worker running them dies, then the non-idempotent call redelivered
    to the other worker (which never saw it) is refused there, not run a second time;
    the idempotent one runs again; the run ends with both answered."""
    ledger = tmp_path / "ledger.txt"
    namespace = new_namespace()
    AMQP_NAMESPACES.append(namespace)
    with EmbeddedRedis() as server:
        settings = make_settings(
            broker_url=amqp_url,
            result_backend=server.url,
            namespace=namespace,
            config=LOSS_POLICY,
            redelivery_margin=2.0,
            tool_modules=("tests.ledger_tools",),
        )
        env = {"TOOLFLEET_TEST_LEDGER": str(ledger)}
        workers = [
            start_worker(settings, pool="threads", concurrency=4, name=f"tf-rmq-{n}", extra_env=env)
            for n in (1, 2)
        ]
        dispatcher = dispatcher_for(settings=settings)
        direct = redis.Redis.from_url(server.url)
        try:
            tools = discover_tools(
                dispatcher=dispatcher, require=["ledger_charge", "ledger_touch"], wait=15
            )
            calls = [
                ("ledger_charge", {"seconds": 3.0, "tag": "c0"}),
                ("ledger_touch", {"seconds": 3.0, "tag": "t0"}),
            ]
            agent = create_agent(
                one_turn(calls), tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
            )
            outcome: dict[str, Any] = {}

            def run() -> None:
                try:
                    outcome["state"] = agent.invoke({"messages": [("user", "go")]})
                except BaseException as exc:
                    outcome["error"] = exc

            runner = threading.Thread(target=run, daemon=True)
            runner.start()
            wait_until(lambda: started_calls(settings) == 2, 30, "the start of both calls")
            pid = wait_until(lambda: _pid_of(ledger, "c0"), 10, "the charge's ledger line")
            first, second = sorted(workers, key=lambda w: w.pid != pid)
            assert first.pid == pid
            direct.flushall()
            lost_at = time.monotonic()
            first.kill()  # its calls go back to RabbitMQ, and to the other worker
            runner.join(timeout=TIME_LIMIT + MARGIN + 30)
            took = time.monotonic() - lost_at
            app = create_app(settings)
            try:
                wait_until(lambda: workers_idle(app), 30, "idle workers")
            finally:
                app.close()
            refused = [
                meta
                for key in direct.scan_iter(match=f"{namespace}:celery-task-meta-*")
                if (meta := json.loads(direct.get(key) or b"{}"))
                and "Redis lost its records" in json.dumps(meta)
            ]
        finally:
            direct.close()
            dispatcher.close()
        assert not runner.is_alive(), "the run hangs after Redis lost its data"
    assert "error" not in outcome, repr(outcome.get("error"))
    runs = ledger_runs(ledger)
    print(f"charge runs {dict(runs['charge'])}, touch runs {dict(runs['touch'])}, {took:.1f} s")
    assert runs["charge"] == {"c0": 1}, runs["charge"]
    assert runs["touch"]["t0"] >= 1
    messages = [m for m in outcome["state"]["messages"] if isinstance(m, ToolMessage)]
    assert len(messages) == 2, [m.content for m in messages]
    assert "may have partially run" in str(messages[0].content), messages[0].content
    assert took <= TIME_LIMIT + MARGIN, took
    # The second worker, which never saw the call before, refused it itself.
    assert refused and second.hostname in json.dumps(refused), refused
