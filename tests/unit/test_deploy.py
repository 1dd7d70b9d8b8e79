"""The deployment files agree with each other and with the code: Dockerfile, compose, .env."""

from __future__ import annotations

import re
import shlex
import string
import tomllib
from typing import Any

import pytest

from tests.support.compose import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    MissingVariable,
    dockerfile_instructions,
    env_example,
    exec_form,
    interpolate,
    load_compose,
    services,
    size_bytes,
    variables,
)
from tests.support.fleet import REPO
from tool_workers.contract.connections import sentinel_addresses
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.placeholders import is_placeholder, refuse_placeholders
from tool_workers.contract.settings import Settings, ToolPolicies

SECRETS = {
    "REDIS_PASSWORD": "pw",
    "FLOWER_BASIC_AUTH": "ops:pw",
    "TOOLFLEET_API_TOKENS": "t",
    "TOOLFLEET_SIGNING_KEY": "5f0c9e7a2b4d6e8f1a3c5e7b9d0f2a4c",
}
TOOLFLEET_SERVICES = ("tool-worker", "sandbox-worker", "flower", "orchestrator")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
NOT_IN_IMAGE = {"dev", "bench", "docs"}
"""Extras for working on toolfleet (tests, benchmarks, the documentation site), not for
running it."""


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def seconds(duration: str) -> float:
    """A compose duration (``330s``, ``5m30s``, ``1h``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts, duration
    return sum(float(n) * units[unit] for n, unit in parts)


def server_config(service: dict[str, Any]) -> list[list[str]]:
    """The configuration a Redis or Sentinel service started through ``sh -c`` runs with,
    line by line: the lines its first start writes to its config file, then the options
    it passes at every start, with the variables of its environment (and ``HOSTNAME``, its
    hostname) filled in. ``--sentinel`` alone is Sentinel mode, not a line."""
    kind, flag, script = service["command"]
    assert (kind, flag) == ("sh", "-c"), service["command"]
    first, start = (shlex.split(line) for line in script.replace("\\\n", " ").splitlines())
    written = first[first.index("printf") + 2 : first.index(">")]
    config_file = first[first.index(">") + 1]
    # Written only when missing: the server's own rewrites of it survive a restart.
    assert first[: first.index("printf")] == ["test", "-s", config_file, "||"], first
    assert first[first.index("printf") + 1] == "%s\\n"
    assert start[:3] == ["exec", "redis-server", config_file], start
    options: list[list[str]] = []
    for word in start[3:]:
        if word.startswith("--"):
            options.append([word[2:]])
        else:
            options[-1].append(word)
    env = {**service.get("environment", {}), "HOSTNAME": service.get("hostname", "")}
    lines = [line.split() for line in written] + [o for o in options if o != ["sentinel"]]
    return [[string.Template(word).substitute(env) for word in line] for line in lines]


def documented_sentinel_env(text: str) -> dict[str, str]:
    """The .env lines for the sentinel profile a file shows in its comments."""
    names = ("TOOLFLEET_BROKER_URL", "TOOLFLEET_SENTINEL_MASTER", "TOOLFLEET_SENTINEL_PASSWORD")
    shown = dict(re.findall(rf"^#\s+({'|'.join(names)})=(\S+)$", text, re.MULTILINE))
    assert set(shown) == set(names), shown
    assert shown["TOOLFLEET_BROKER_URL"].startswith("sentinel://")
    return shown


def test_dockerfile_installs_the_project_with_every_runtime_extra() -> None:
    """Given the Dockerfile, then it copies this pyproject and installs the project with
    every runtime extra (Flower, checkpointer, server), on a Python the project allows."""
    instructions = dockerfile_instructions()
    base = next(args for keyword, args in instructions if keyword == "FROM")
    copies = [args.split() for keyword, args in instructions if keyword == "COPY"]
    installs = [
        args for keyword, args in instructions if keyword == "RUN" and "pip install" in args
    ]

    assert re.fullmatch(r"python:3\.(\d+)-slim", base)
    minimum = pyproject()["project"]["requires-python"]
    assert int(base.split(".")[1].split("-")[0]) >= int(minimum.split(".")[1])
    assert any("pyproject.toml" in copy[:-1] for copy in copies)
    for package in pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        assert any(package in copy[:-1] for copy in copies), package
    (install,) = installs
    extras = set(re.search(r"'\.\[([^\]]*)\]'", install).group(1).split(","))  # type: ignore[union-attr]
    assert extras == set(pyproject()["project"]["optional-dependencies"]) - NOT_IN_IMAGE


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [args for keyword, args in dockerfile_instructions() if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_image_default_command_is_the_default_pool_of_compose() -> None:
    """Given the image's CMD, then it is the tool-worker service's command with the
    compose defaults, so `docker run toolfleet` starts the same worker compose does."""
    cmd = next(args for keyword, args in reversed(dockerfile_instructions()) if keyword == "CMD")

    assert exec_form(cmd) == services(SECRETS)["tool-worker"]["command"]


def test_every_command_is_one_the_image_provides() -> None:
    """Given the compose services built from the image, then each runs `celery -A
    tool_workers ...` (celery, with Flower from the ops extra) or the project's script."""
    scripts = set(pyproject()["project"]["scripts"])
    for name in TOOLFLEET_SERVICES:
        command = services(SECRETS)[name]["command"]
        assert command[0] in scripts | {"celery"}, name
        if command[0] == "celery":
            assert command[1:3] == ["-A", "tool_workers"], name


def test_toolfleet_services_share_one_image_and_build() -> None:
    all_services = services(SECRETS)
    images = {all_services[name]["image"] for name in TOOLFLEET_SERVICES}
    builds = {str(all_services[name].get("build")) for name in TOOLFLEET_SERVICES}
    assert images == {"toolfleet:latest"}
    assert builds == {"."}


def test_workers_consume_their_queues_and_send_events() -> None:
    """Given the worker services, then the default pool consumes `tools`, the sandbox pool
    `sandbox` (where config/toolfleet.toml routes run_python) with fewer processes and a
    memory limit, both prefork with -E and node names of their own."""
    all_services = services(SECRETS)
    policies = ToolPolicies.load(REPO / "config" / "toolfleet.toml")

    def option(command: list[str], flag: str) -> str:
        return command[command.index(flag) + 1]

    tool, sandbox = all_services["tool-worker"], all_services["sandbox-worker"]
    assert option(tool["command"], "-Q") == policies.defaults.queue == "tools"
    assert option(sandbox["command"], "-Q") == policies.for_tool("run_python").queue
    for service in (tool, sandbox):
        assert option(service["command"], "-P") == "prefork"
        assert "-E" in service["command"]
        assert "container_name" not in service  # scalable
        assert "ports" not in service
    assert int(option(sandbox["command"], "-c")) < int(option(tool["command"], "-c"))
    assert sandbox["mem_limit"]
    assert option(tool["command"], "-n").startswith("tool-worker@")
    assert option(sandbox["command"], "-n").startswith("sandbox-worker@")


def test_worker_healthchecks_check_their_own_node_without_loading_the_tools() -> None:
    """Given a worker's healthcheck, then it asks about its own node only, through
    tool_workers.health: not `celery -A tool_workers ...`, which imports every tool
    module on every check."""
    for name in ("tool-worker", "sandbox-worker"):
        service = services(SECRETS)[name]
        kind, test = service["healthcheck"]["test"]
        node = service["command"][service["command"].index("-n") + 1]
        assert kind == "CMD-SHELL"
        assert test.split()[:4] == [
            "python",
            "-m",
            "tool_workers.health",
            node.replace("%h", "$HOSTNAME"),
        ]
        assert "celery" not in test


def test_redis_never_evicts_and_has_a_memory_ceiling() -> None:
    """Given the bundled Redis, then it has a maxmemory with the noeviction policy (an
    evicting policy would drop queued calls and results), below its container's limit."""
    redis = services(SECRETS)["redis"]
    command = redis["command"]
    maxmemory = command[command.index("--maxmemory") + 1]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert size_bytes(maxmemory) < size_bytes(redis["mem_limit"])
    assert redis["memswap_limit"] == redis["mem_limit"]


def test_every_long_running_service_has_a_memory_limit_and_rotated_logs() -> None:
    for name, service in services(SECRETS).items():
        assert size_bytes(service["mem_limit"]) >= 256 * 2**20, name
        logging = service["logging"]
        assert logging["driver"] == "json-file", name
        assert size_bytes(logging["options"]["max-size"]) <= 100 * 2**20, name
        assert 1 <= int(logging["options"]["max-file"]) <= 20, name


def test_orchestrator_stop_grace_period_outlasts_its_drain() -> None:
    """Given `docker compose stop` (SIGTERM, then SIGKILL after the grace period), then
    the orchestrator has its drain time and 10 s more to hand its runs on, instead of
    Docker's default 10 s cutting it off."""
    orchestrator = services(SECRETS)["orchestrator"]
    drain = float(orchestrator["environment"]["TOOLFLEET_DRAIN_SECONDS"])
    assert drain == Settings().drain_seconds
    assert seconds(orchestrator["stop_grace_period"]) >= drain + 10


def test_env_example_leaves_every_secret_empty_so_compose_refuses_it() -> None:
    """Given .env copied from config/.env.example unchanged, then compose refuses to
    start, naming a secret to set (the example carries no placeholder that would pass)."""
    example = env_example()
    for secret in SECRETS:
        assert example[secret] == "", secret
    with pytest.raises(MissingVariable, match="REDIS_PASSWORD"):
        services(example)


def test_placeholders_are_refused_by_name() -> None:
    """Given a placeholder (the ones examples use) for a password or token, then the
    processes' start-up check refuses it with one line naming the variable and never
    the value; secrets of their own pass."""
    flower_env = {"FLOWER_BASIC_AUTH": "ops:s3cr3t-of-its-own,admin:change-me"}
    cases = [
        ("TOOLFLEET_BROKER_URL", "change-me-to-a-long-random-hex-string", "broker_url",
         "redis://:{}@redis:6379/0"),
        ("TOOLFLEET_API_TOKENS", "changeme", "api_tokens", "3f1b9c0e,{}"),
        ("TOOLFLEET_DATABASE_URL", "changeit", "database_url", "postgresql://app:{}@db/app"),
        ("TOOLFLEET_RESULT_BACKEND", "CHANGE-ME", "result_backend", "redis://u:{}@redis:6379/1"),
    ]  # fmt: skip
    for variable, placeholder, field, template in cases:
        settings = Settings(**{field: template.format(placeholder)})
        with pytest.raises(ConfigError, match=variable) as caught:
            refuse_placeholders(settings, {})
        assert "\n" not in str(caught.value)
        assert placeholder not in str(caught.value)
    with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH"):
        refuse_placeholders(Settings(), flower_env)
    own = Settings(broker_url="redis://:9d2c51f0a7e4@redis:6379/0", api_tokens="b41e2f07")  # type: ignore[arg-type]
    refuse_placeholders(own, {"FLOWER_BASIC_AUTH": "ops:9d2c51f0a7e4"})
    for placeholder in ("change-me", "changeme", "change-me-to-a-long-random-hex-string"):
        assert is_placeholder(placeholder)


def test_stop_grace_period_outlasts_the_longest_time_limit() -> None:
    """Given a rolling restart (SIGTERM, then SIGKILL after the grace period), then a
    call that started just before it can still run to its hard time limit."""
    longest = ToolPolicies.load(REPO / "config" / "toolfleet.toml").longest_time_limit()
    for name in ("tool-worker", "sandbox-worker"):
        assert seconds(services(SECRETS)[name]["stop_grace_period"]) >= longest, name


def test_redis_persists_requires_a_password_and_has_a_healthcheck() -> None:
    redis = services(SECRETS)["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert redis["command"][redis["command"].index("--requirepass") + 1] == "pw"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "ping" in " ".join(redis["healthcheck"]["test"])


def test_one_refusal_names_every_secret_to_set() -> None:
    """Given an .env with no secret set, then the first refusal already names each one
    the file needs (one run, not one per secret)."""
    with pytest.raises(MissingVariable) as refused:
        services(env_example())
    for secret in SECRETS:
        assert secret in str(refused.value), secret


def test_secrets_have_no_default() -> None:
    """Given no REDIS_PASSWORD or no FLOWER_BASIC_AUTH, then compose refuses to start."""
    for missing in SECRETS:
        env = {k: v for k, v in SECRETS.items() if k != missing}
        with pytest.raises(MissingVariable, match=missing):
            services(env)


def test_flower_uses_basic_auth_persistent_state_and_a_private_port() -> None:
    flower = services(SECRETS)["flower"]
    env = flower["environment"]
    assert env["FLOWER_BASIC_AUTH"] == "ops:pw"
    assert env["FLOWER_PERSISTENT"] == "True"
    assert env["FLOWER_DB"].startswith("/data/")
    assert any(volume.endswith(":/data") for volume in flower["volumes"])
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])


@pytest.mark.parametrize("source", ["compose default", ".env.example"])
def test_flower_tasks_page_shows_the_call_line_and_its_status(source: str) -> None:
    """Given the flower service (with compose's default, or .env copied from
    config/.env.example), then Flower reads a Tasks page column list from its environment
    that names only columns Flower has, among them args (the masked arguments), exception
    (a failed call's) and worker, which Flower's own default does not all show."""
    from flower.options import options
    from flower.views.tasks import visible_task_columns

    # The example leaves the secrets empty (compose refuses it as is): fill them in.
    env = SECRETS if source == "compose default" else {**env_example(), **SECRETS}
    value = str(services(env)["flower"]["environment"]["FLOWER_TASKS_COLUMNS"])
    slugs = value.split(",")
    default = str(options.tasks_columns)  # Flower's default: nothing parsed it here

    assert [slug for slug, _ in visible_task_columns(value)] == slugs
    assert {"args", "exception", "worker"} <= set(slugs)
    assert not {"args", "exception", "worker"} <= set(default.split(","))


def test_orchestrator_waits_for_healthy_redis_and_workers() -> None:
    depends = services(SECRETS)["orchestrator"]["depends_on"]
    assert {name: dep["condition"] for name, dep in depends.items()} == {
        "redis": "service_healthy",
        "rabbitmq": "service_healthy",
        "sentinel-1": "service_healthy",
        "sentinel-2": "service_healthy",
        "sentinel-3": "service_healthy",
        "tool-worker": "service_healthy",
        "sandbox-worker": "service_healthy",
    }


def test_every_setting_reaches_the_services_and_is_documented() -> None:
    """Given every TOOLFLEET_* setting, then the services' shared environment passes it
    on and config/.env.example lists it, as it lists every variable compose reads."""
    settings = {f"TOOLFLEET_{name.upper()}" for name in Settings.model_fields}
    shared = load_compose()["x-toolfleet-env"]
    # Secrets and settings of the HTTP service the workers need not see.
    orchestrator_only = {
        "TOOLFLEET_API_TOKENS",
        "TOOLFLEET_WEBHOOK_ALLOWED_HOSTS",
        "TOOLFLEET_WEBHOOK_SECRET",
        "TOOLFLEET_WEBHOOK_TIMEOUT",
        "TOOLFLEET_WEBHOOK_ATTEMPTS",
        "TOOLFLEET_CORS_ORIGINS",
        "TOOLFLEET_DRAIN_SECONDS",
        "TOOLFLEET_RUN_ATTEMPTS",
    }
    example = env_example()

    assert settings - orchestrator_only <= set(shared), settings - set(shared)
    assert orchestrator_only <= set(load_compose()["services"]["orchestrator"]["environment"])
    assert not orchestrator_only & set(shared)
    assert settings <= set(example), settings - set(example)
    assert variables(load_compose()) <= set(example), variables(load_compose()) - set(example)


def test_env_example_yields_a_valid_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given .env copied from config/.env.example with its secrets set, then every
    service interpolates and its TOOLFLEET_* environment parses as Settings (empty
    values: the defaults)."""
    example = {**env_example(), **SECRETS}
    all_services = services(example)
    for name in TOOLFLEET_SERVICES:
        with monkeypatch.context() as patch:
            for key, value in all_services[name]["environment"].items():
                patch.setenv(key, str(value))
            settings = Settings()
        assert settings.broker_url == f"redis://:{example['REDIS_PASSWORD']}@redis:6379/0"
        assert settings.registry_refresh == Settings.model_fields["registry_refresh"].default
        assert settings.log_json is True


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert (
        interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} $${SET}", env) == "x d  d ${SET}"
    )
    assert interpolate("${UNSET:-a${SET}b}", env) == "axb"
    with pytest.raises(MissingVariable, match="EMPTY: need it"):
        interpolate("${EMPTY:?need it}", env)


def test_rabbitmq_profile_is_optional_healthy_and_its_password_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the rabbitmq profile and .env pointing the broker at it, then RabbitMQ runs
    only with that profile, has a healthcheck and a persistent volume, takes its login
    from .env (no default password, refused empty), and every toolfleet service parses
    settings with RabbitMQ as the broker and the bundled Redis for the rest."""
    env = {
        **env_example(),
        **SECRETS,
        "RABBITMQ_PASSWORD": "rpw",
        "TOOLFLEET_BROKER_URL": "amqp://toolfleet:rpw@rabbitmq:5672//",
        "TOOLFLEET_REDIS_URL": "redis://:pw@redis:6379/0",
    }
    all_services = services(env)
    rabbit = all_services["rabbitmq"]

    assert rabbit["profiles"] == ["rabbitmq"]
    assert "check_port_connectivity" in rabbit["healthcheck"]["test"]
    assert any(volume.endswith(":/var/lib/rabbitmq") for volume in rabbit["volumes"])
    assert rabbit["environment"]["RABBITMQ_DEFAULT_PASS"] == "rpw"
    assert services(SECRETS)["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_PASS"] == ""
    assert 'test -n "$$RABBITMQ_DEFAULT_PASS"' in " ".join(
        load_compose()["services"]["rabbitmq"]["entrypoint"]
    )
    assert all(port.startswith("127.0.0.1:") for port in rabbit["ports"])
    for name in TOOLFLEET_SERVICES:
        service = all_services[name]
        assert service["depends_on"]["rabbitmq"] == {
            "condition": "service_healthy",
            "required": False,
        }, name
        with monkeypatch.context() as patch:
            for key, value in service["environment"].items():
                patch.setenv(key, str(value))
            settings = Settings()
        assert settings.broker_is_amqp, name
        assert settings.own_redis_url == "redis://:pw@redis:6379/0", name


def test_sandbox_worker_runs_snippets_as_another_user_than_the_password_holders() -> None:
    """Given the sandbox-worker service, then it runs as root with no capability but the
    five that let it give each call namespaces of its own and a uid of its own (and kill
    them), and no new privileges: every process holding the broker password (the worker,
    init, the healthcheck) is root's, out of reach of the calls' uids. It accepts no
    isolation weaker than namespaces unless the operator names one."""
    sandbox = services(SECRETS)["sandbox-worker"]
    assert sandbox["user"] == "root"
    assert sandbox["cap_drop"] == ["ALL"]
    assert sorted(sandbox["cap_add"]) == ["CHOWN", "KILL", "SETGID", "SETUID", "SYS_ADMIN"]
    assert "no-new-privileges:true" in sandbox["security_opt"]
    environment = sandbox["environment"]
    assert environment["TOOLFLEET_SANDBOX_UIDS"] in ("", None) or "0" not in str(
        environment["TOOLFLEET_SANDBOX_UIDS"]
    ).split(",")
    for name in ("sandbox-worker", "tool-worker", "orchestrator", "flower"):
        assert services(SECRETS)[name]["environment"].get("TOOLFLEET_SANDBOX_MIN_ISOLATION") in (
            "",
            None,
            "namespaces",
        ), name


def test_sandbox_worker_may_make_the_namespaces_of_each_call() -> None:
    """Given the sandbox-worker service, then it holds CAP_SYS_ADMIN (unshare and mount
    of the calls' pid, mount and IPC namespaces), keeps Docker's default seccomp profile
    (which allows unshare and mount to a process holding it) and runs unconfined by
    AppArmor (docker-default denies every mount); its settings refuse calls when the
    namespaces are missing after all (TOOLFLEET_SANDBOX_MIN_ISOLATION is namespaces)."""
    sandbox = services(SECRETS)["sandbox-worker"]
    assert "SYS_ADMIN" in sandbox["cap_add"]
    assert "apparmor:unconfined" in sandbox["security_opt"]
    assert not [o for o in sandbox["security_opt"] if o.startswith("seccomp")]
    with pytest.MonkeyPatch.context() as patch:
        for key, value in sandbox["environment"].items():
            if value not in ("", None):
                patch.setenv(key, str(value))
        assert Settings().sandbox_min_isolation == "namespaces"


def test_sentinel_profile_runs_a_replica_of_redis_and_three_sentinels_watching_it() -> None:
    """Given the sentinel profile, then it runs a replica of the bundled redis (its peer in
    password, persistence and memory, so that it can take over) and three Sentinels, each
    with a healthcheck and a volume of its own, that watch redis under one master name
    with quorum 2, reach it with REDIS_PASSWORD, require it of their own clients and name
    every server by its service name; redis can follow the replica after a failover."""
    all_services = services(SECRETS)
    redis = all_services["redis"]
    profiled = {name for name, service in all_services.items() if "profiles" in service}
    sentinel_services = {
        name for name in profiled if all_services[name]["profiles"] == ["sentinel"]
    }
    assert sentinel_services == {"redis-replica", *SENTINELS}

    def option(command: list[str], flag: str) -> str:
        return command[command.index(flag) + 1]

    replica = all_services["redis-replica"]
    replica_config = server_config(replica)
    assert replica["image"] == redis["image"]
    assert ["replicaof", "redis", "6379"] in replica_config
    assert ["requirepass", "pw"] in replica_config
    assert ["masterauth", "pw"] in replica_config
    assert ["appendonly", "yes"] in replica_config
    assert ["maxmemory", option(redis["command"], "--maxmemory")] in replica_config
    assert ["maxmemory-policy", "noeviction"] in replica_config
    assert ["replica-announce-ip", "redis-replica"] in replica_config
    assert replica["mem_limit"] == redis["mem_limit"]
    assert replica["healthcheck"]["test"] == redis["healthcheck"]["test"]
    # After a failover redis is the replica: it authenticates and announces its name.
    assert option(redis["command"], "--masterauth") == "pw"
    assert option(redis["command"], "--replica-announce-ip") == "redis"

    monitors = set()
    for name in SENTINELS:
        sentinel = all_services[name]
        config = server_config(sentinel)
        (monitor,) = [line[2:] for line in config if line[:2] == ["sentinel", "monitor"]]
        master = monitor[0]
        monitors.add(tuple(monitor))
        assert sentinel["image"] == redis["image"]
        assert "redis-cli -p 26379 ping" in " ".join(sentinel["healthcheck"]["test"])
        assert ["sentinel", "auth-pass", master, "pw"] in config
        assert ["requirepass", "pw"] in config
        assert ["sentinel", "resolve-hostnames", "yes"] in config
        assert ["sentinel", "announce-hostnames", "yes"] in config
        assert ["sentinel", "announce-ip", name] in config
        assert sentinel["volumes"] == [f"{name}-data:/data"]
        assert sentinel["depends_on"]["redis"]["condition"] == "service_healthy"
    assert monitors == {("toolfleet", "redis", "6379", "2")}
    data = [all_services[name]["volumes"] for name in ("redis", "redis-replica", *SENTINELS)]
    assert all(volumes[0].endswith(":/data") for volumes in data)
    assert len({volumes[0] for volumes in data}) == len(data)  # a volume of its own each


def test_sentinel_profile_leaves_the_default_deployment_as_it_was() -> None:
    """Given `docker compose up` without a profile, then it starts the bundled redis and
    toolfleet's services only, no replica or Sentinel, and the fleet uses redis directly;
    toolfleet's services wait for the Sentinels only when the profile runs them."""
    all_services = services(SECRETS)
    default = {name for name, service in all_services.items() if "profiles" not in service}

    assert default == {"redis", *TOOLFLEET_SERVICES}
    assert "--replicaof" not in all_services["redis"]["command"]
    for name in TOOLFLEET_SERVICES:
        service = all_services[name]
        for sentinel in SENTINELS:
            assert service["depends_on"][sentinel] == {
                "condition": "service_healthy",
                "required": False,
            }, name
        environment = service["environment"]
        assert environment["TOOLFLEET_BROKER_URL"] == "redis://:pw@redis:6379/0", name
        assert environment["TOOLFLEET_SENTINEL_MASTER"] == "", name


def test_sentinel_url_the_files_document_parses_as_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the .env lines docker-compose.yml and config/.env.example show for the
    sentinel profile, then they agree, the URL names the profile's three Sentinels with
    the primary's password, the master is the one the Sentinels watch, and every toolfleet
    service parses them as Settings whose results and records go through the Sentinels."""
    documented = documented_sentinel_env(COMPOSE_FILE.read_text())
    assert documented_sentinel_env(ENV_EXAMPLE.read_text()) == documented
    # Compose fills in ${REDIS_PASSWORD} in .env as it does in the compose file.
    env = {**env_example(), **SECRETS}
    env.update({key: interpolate(value, env) for key, value in documented.items()})
    url = env["TOOLFLEET_BROKER_URL"]
    all_services = services(env)
    (monitor,) = {
        tuple(line[2:])
        for name in SENTINELS
        for line in server_config(all_services[name])
        if line[:2] == ["sentinel", "monitor"]
    }

    settings = Settings(broker_url=url, sentinel_master="toolfleet")
    assert settings.backend_url == url
    assert env["TOOLFLEET_SENTINEL_MASTER"] == monitor[0] == "toolfleet"
    hosts, primary = sentinel_addresses(url)
    assert hosts == [(name, 26379) for name in SENTINELS]
    assert primary == {"password": "pw", "db": 0}
    for name in TOOLFLEET_SERVICES:
        with monkeypatch.context() as patch:
            for key, value in all_services[name]["environment"].items():
                patch.setenv(key, str(value))
            from_env = Settings()
        assert from_env.broker_url == from_env.own_redis_url == url, name
        assert from_env.sentinel_master == "toolfleet", name
        assert from_env.sentinel_password == "pw", name
