"""Shared fixtures: a real Redis server, a key namespace per test, real worker processes.

Redis is the server at ``TOOLFLEET_TEST_REDIS_URL`` when set (CI points it at the
machine's Redis), else an embedded ``valkey-server`` this session starts. Every test
gets its own namespace, which prefixes every key and queue it touches (Celery's,
kombu's and toolfleet's), so tests and concurrent runs never see each other's calls;
the session deletes its keys at the end. A missing server fails the run: it never
skips.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from blockbuster import blockbuster_ctx

from orchestrator.dispatch.fleet import close_all
from orchestrator.local import EmbeddedRedis, WorkerProcess, delete_keys
from tests.support.amqp import (
    AMQP_NAMESPACES,
    amqp_problem,
    amqp_test_url,
    brokers,
    delete_namespace,
)
from tests.support.exclusive import remove_locks, share_run_uid, turn
from tests.support.fleet import RUN_ID, TEST_QUEUES, fleet_settings, new_namespace, worker_env
from tool_workers.contract.settings import Settings

SCANNED_MODULES = ["orchestrator", "tool_workers"]
"""Where the blocking-call detector looks: blocking calls made by toolfleet's own code."""


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the Redis server the tests use."""
    url = os.environ.get("TOOLFLEET_TEST_REDIS_URL")
    if url:
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        except redis.RedisError as exc:
            pytest.fail(f"TOOLFLEET_TEST_REDIS_URL={url} does not answer: {exc!r}")
        client.close()
        yield url
        delete_keys(url, f"tft-{RUN_ID}-*")
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a PostgreSQL database the tests may create schemas in:
    ``TOOLFLEET_TEST_DATABASE_URL`` when set (it must answer), else an embedded server
    this session starts (pgserver, in the dev extra), as Redis is started when not named."""
    import psycopg

    named = os.environ.get("TOOLFLEET_TEST_DATABASE_URL")
    if named:
        try:
            with psycopg.connect(named, connect_timeout=5):
                pass
        except psycopg.Error as exc:
            pytest.fail(f"TOOLFLEET_TEST_DATABASE_URL={named} does not work: {exc!r}")
        yield named
        return
    with warnings.catch_warnings():
        # platformdirs warns where XDG_RUNTIME_DIR is unset (a container, root): harmless.
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(tmp_path_factory.mktemp("postgres"), cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """URL of the RabbitMQ server the RabbitMQ cases use: ``TOOLFLEET_TEST_AMQP_URL``, or
    one answering on this machine's default port with the default login.

    Those cases are generated only where a server answers; one named by the variable
    that does not answer fails them, naming the server.
    """
    url = amqp_test_url()
    if not url:
        pytest.fail("a RabbitMQ case ran with no RabbitMQ server answering")
    problem = amqp_problem(url)
    if problem is not None:
        pytest.fail(f"TOOLFLEET_TEST_AMQP_URL={url} does not answer: {problem}")
    yield url
    for namespace in AMQP_NAMESPACES:
        delete_namespace(url, namespace, TEST_QUEUES)


ROOT_MODULES = ("test_net_", "test_netns_", "test_sandbox.py")
"""Test modules whose every test needs root: hosts in network namespaces and nftables;
run_python workers as root and as another user (the test switches users)."""


def pytest_configure(config: pytest.Config) -> None:
    share_run_uid(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_locks(config)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's clock
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # A test marked serial runs while no other test of this run does (see exclusive.py).
    with turn(alone=item.get_closest_marker("serial") is not None):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The tests that need root form the "root" group: the README's command runs the rest
    # as any user; .ci/run runs this group as root (pytest -m root).
    for item in items:
        if item.path.name.startswith(ROOT_MODULES) or "net" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.root)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A test asking for ``broker`` runs on Redis, and on RabbitMQ too where one is set.
    if "broker" in metafunc.fixturenames:
        metafunc.parametrize("broker", brokers(), indirect=True)


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The broker a test runs on: ``redis`` or ``rabbitmq`` (parametrized)."""
    return str(request.param)


@pytest.fixture
def broker_settings(
    broker: str, request: pytest.FixtureRequest, redis_url: str
) -> Iterator[dict[str, Any]]:
    """Settings overrides for the test's broker: RabbitMQ for calls with Redis for the
    rest, or nothing (Redis for all). A RabbitMQ test's queues are deleted at the end."""
    if broker == "redis":
        yield {}
        return
    url = request.getfixturevalue("amqp_url")
    namespace = new_namespace()
    AMQP_NAMESPACES.append(namespace)
    yield {"broker_url": url, "result_backend": redis_url, "namespace": namespace}


@pytest.fixture
def make_settings(redis_url: str, tmp_path: Path) -> Callable[..., Settings]:
    """Settings for the test fleet; each call without ``namespace`` gets a fresh one."""

    def make(**overrides: Any) -> Settings:
        return fleet_settings(redis_url, tmp_path, **overrides)

    return make


@pytest.fixture(scope="session")
def shared_fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A fleet the read-only integration tests share: a prefork worker (time limits) and a
    threads worker (I/O fan-out). Tests that kill, restart or count workers start their own.
    """
    workdir = tmp_path_factory.mktemp("shared-fleet")
    settings = fleet_settings(redis_url, workdir)
    workers = [
        WorkerProcess(
            settings,
            name="tf-shared-prefork",
            pool="prefork",
            concurrency=2,
            queues=("tools", "prefork"),
            log_file=workdir / "prefork.log",
            extra_env=worker_env(settings),
        ),
        WorkerProcess(
            settings,
            name="tf-shared-threads",
            pool="threads",
            concurrency=64,
            queues=("tools",),
            log_file=workdir / "threads.log",
            extra_env=worker_env(settings),
        ),
    ]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.wait_ready()
        yield settings
    finally:
        for worker in workers:
            worker.stop(grace=5)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real ``celery worker`` processes; all are stopped after the test."""
    started: list[WorkerProcess] = []

    def start(settings: Settings, *, wait: bool = True, **kwargs: Any) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        kwargs.setdefault("queues", ("tools", "prefork"))
        worker = WorkerProcess(
            settings,
            log_file=log,
            extra_env={**worker_env(settings), **kwargs.pop("extra_env", {})},
            **kwargs,
        )
        started.append(worker)
        worker.start()
        if wait:
            try:
                worker.wait_ready()
            except RuntimeError:
                print(log.read_text(errors="replace")[-4000:])
                raise
        return worker

    yield start
    for worker in started:
        worker.stop(grace=5)


@pytest.fixture
def counter(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test Redis, for reading side-effect counters."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _no_blocking_calls() -> Iterator[None]:
    """Every test runs with LangGraph's server's blocking-call detector on: toolfleet code
    that blocks a running event loop (a socket, a sleep, a file read) raises BlockingError
    there, as it would under ``langgraph dev``."""
    with blockbuster_ctx(SCANNED_MODULES):
        yield


_after_unit_tests = [False]
"""Whether the last test this process ran was a unit test."""


@pytest.fixture(autouse=True)
def _close_dispatchers(request: pytest.FixtureRequest) -> Iterator[None]:
    # Each test's dispatchers (and their listener threads) end with the test. Then the
    # garbage of a test that uses services is collected, so a socket it left open fails
    # that test with a ResourceWarning, not whichever test runs when the collector gets
    # to it (unit tests open none, and a collection per test would double their time).
    unit = "unit" in request.node.path.parts
    if not unit and _after_unit_tests[0]:
        # In several processes unit tests run between the others: what a unit test left
        # for the collector (uncollected, by design) is collected now, quietly, so it
        # fails no later test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
    _after_unit_tests[0] = unit
    yield
    close_all()
    if not unit:
        gc.collect()
