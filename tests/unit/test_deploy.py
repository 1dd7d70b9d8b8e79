"""The deployment files agree with each other and with the code: Dockerfile, compose, .env."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from tests.support.compose import (
    MissingVariable,
    dockerfile_instructions,
    env_example,
    exec_form,
    interpolate,
    load_compose,
    services,
    variables,
)
from tests.support.fleet import REPO
from tool_workers.settings import Settings, ToolPolicies

SECRETS = {"REDIS_PASSWORD": "pw", "FLOWER_BASIC_AUTH": "ops:pw", "TOOLFLEET_API_TOKENS": "t"}
TOOLFLEET_SERVICES = ("tool-worker", "sandbox-worker", "flower", "orchestrator")
NOT_IN_IMAGE = {"dev", "bench"}
"""Extras for working on toolfleet (tests, benchmarks), not for running it."""


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def seconds(duration: str) -> float:
    """A compose duration (``330s``, ``5m30s``, ``1h``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts, duration
    return sum(float(n) * units[unit] for n, unit in parts)


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


def test_worker_healthchecks_ping_their_own_node() -> None:
    for name in ("tool-worker", "sandbox-worker"):
        service = services(SECRETS)[name]
        test = " ".join(service["healthcheck"]["test"])
        node = service["command"][service["command"].index("-n") + 1]
        assert "inspect ping" in test
        assert f"-d {node.replace('%h', '$HOSTNAME')}" in test


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
    that names only columns Flower has, among them args (the call line) and result
    (<success>/<error>), which Flower's own default leaves out."""
    from flower.options import options
    from flower.views.tasks import visible_task_columns

    env = SECRETS if source == "compose default" else env_example()
    value = str(services(env)["flower"]["environment"]["FLOWER_TASKS_COLUMNS"])
    slugs = value.split(",")
    default = str(options.tasks_columns)  # Flower's default: nothing parsed it here

    assert [slug for slug, _ in visible_task_columns(value)] == slugs
    assert {"args", "result"} <= set(slugs)
    assert not {"args", "result"} & set(default.split(","))


def test_orchestrator_waits_for_healthy_redis_and_workers() -> None:
    depends = services(SECRETS)["orchestrator"]["depends_on"]
    assert {name: dep["condition"] for name, dep in depends.items()} == {
        "redis": "service_healthy",
        "tool-worker": "service_healthy",
        "sandbox-worker": "service_healthy",
    }


def test_every_setting_reaches_the_services_and_is_documented() -> None:
    """Given every TOOLFLEET_* setting, then the services' shared environment passes it
    on and config/.env.example lists it, as it lists every variable compose reads."""
    settings = {f"TOOLFLEET_{name.upper()}" for name in Settings.model_fields}
    shared = load_compose()["x-toolfleet-env"]
    orchestrator_only = {"TOOLFLEET_API_TOKENS"}  # a secret the workers need not see
    example = env_example()

    assert settings - orchestrator_only <= set(shared), settings - set(shared)
    assert orchestrator_only <= set(load_compose()["services"]["orchestrator"]["environment"])
    assert not orchestrator_only & set(shared)
    assert settings <= set(example), settings - set(example)
    assert variables(load_compose()) <= set(example), variables(load_compose()) - set(example)


def test_env_example_yields_a_valid_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given .env copied from config/.env.example, then every service interpolates and
    its TOOLFLEET_* environment parses as Settings (empty values: the defaults)."""
    example = env_example()
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
