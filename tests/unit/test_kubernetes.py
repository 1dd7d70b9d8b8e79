"""deploy/kubernetes/: every overlay renders, validates strictly against the Kubernetes
schema (kubernetes-validate) and KEDA's documented spec, and agrees with the code: the
lists the ScaledObjects watch are the ones the workers' calls wait in, the grace periods
outlast the time limits, the probes run the worker healthcheck and the server's routes,
secrets are only referenced, and the network policies fence the sandbox and Redis."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from orchestrator.cli.status import broker_key
from orchestrator.server.routes.system import router as system_routes
from tests.support import kustomize
from tests.support.fleet import REPO
from tests.support.keda import SCHEMAS
from tests.support.kubernetes import (
    OVERLAYS,
    WORKER_KINDS,
    deployment_settings,
    worker_command,
    worker_queues,
)
from tool_workers.builtin import get_tools
from tool_workers.contract.broker import create_app

KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
"""The oldest Kubernetes release still served by the big clouds, and the newest the
package knows."""
SECRET_NAMES = re.compile(r"PASSWORD|TOKEN|SECRET|SIGNING_KEY|API_KEY|BASIC_AUTH|_URL$")


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    name = str(request.param)
    return name, kustomize.render(REPO / "deploy" / "kubernetes" / "overlays" / name)


def of_kind(resources: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in resources if r["kind"] == kind]


def pod_spec(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = kustomize.find(resources, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def test_every_builtin_kind_validates_strictly_against_the_kubernetes_schema(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given each overlay rendered, then every resource of a built-in kind passes
    kubernetes-validate in strict mode (no unknown field anywhere) for each version."""
    _, resources = overlay
    builtin = [r for r in resources if not r["apiVersion"].startswith("keda.sh/")]
    assert {r["kind"] for r in builtin} >= {
        "Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "NetworkPolicy",
        "ServiceAccount",
    }  # fmt: skip
    for version in KUBERNETES_VERSIONS:
        for resource in builtin:
            kubernetes_validate.validate(resource, version, strict=True)


def test_keda_resources_follow_kedas_spec(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, resources = overlay
    keda = [r for r in resources if r["apiVersion"].startswith("keda.sh/")]
    assert {r["kind"] for r in keda} == {"ScaledObject", "TriggerAuthentication"}
    for resource in keda:
        jsonschema.validate(resource, SCHEMAS[resource["kind"]])
    for scaled in of_kind(resources, "ScaledObject"):
        spec = scaled["spec"]
        assert 0 < spec["minReplicaCount"] <= spec["maxReplicaCount"], scaled["metadata"]
        for trigger in spec["triggers"]:
            kustomize.find(resources, "TriggerAuthentication", trigger["authenticationRef"]["name"])


def test_a_misspelt_field_fails_each_validation() -> None:
    """Given a Deployment and a ScaledObject each with one unknown field, then each
    validation refuses it (the checks above are strict, not lenient)."""
    resources = kustomize.render(REPO / "deploy" / "kubernetes" / "overlays" / "trial")
    deployment = kustomize.find(resources, "Deployment", "tool-worker")
    bad = kustomize.merge(deployment, {"spec": {"replica": 2}})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)
    scaled = kustomize.find(resources, "ScaledObject", "tool-worker")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            kustomize.merge(scaled, {"spec": {"minReplicas": 1}}), SCHEMAS["ScaledObject"]
        )


def test_each_worker_kind_scales_on_the_list_its_calls_wait_in(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Given each overlay, then each worker Deployment has one ScaledObject, and its
    trigger watches the broker key of the queue the Deployment consumes (-Q), named as
    `toolfleet status` names it (the namespace prefix included), and every built-in tool
    the kind serves is routed there by the policy the pods mount."""
    _, resources = overlay
    settings = deployment_settings(resources, tmp_path)
    app = create_app(settings)
    policies = settings.policies()
    routed = {tool.name: policies.for_tool(tool.name).queue for tool in get_tools(settings)}
    consumed: set[str] = set()
    try:
        for kind in WORKER_KINDS:
            (queue,) = worker_queues(resources, kind)
            consumed.add(queue)
            (scaled,) = [
                s for s in of_kind(resources, "ScaledObject")
                if s["spec"]["scaleTargetRef"]["name"] == kind
            ]  # fmt: skip
            (trigger,) = scaled["spec"]["triggers"]
            watched = trigger["metadata"].get("listName") or trigger["metadata"]["queueName"]
            assert trigger["type"] == ("rabbitmq" if settings.broker_is_amqp else "redis")
            assert watched == broker_key(settings, app, queue), kind
            assert any(q == queue for q in routed.values()), (kind, routed)
    finally:
        app.close()
    # Every built-in tool goes to the list of a kind that is scaled.
    assert set(routed.values()) <= consumed, routed


def test_grace_periods_outlast_the_longest_call_of_each_kind(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Given each worker Deployment, then terminationGracePeriodSeconds is at least the
    longest its tools may hold a call (time limit and retry countdowns) plus the
    redelivery margin, and the liveness probe cannot kill a worker finishing its calls
    after SIGTERM."""
    _, resources = overlay
    settings = deployment_settings(resources, tmp_path)
    policies = settings.policies()
    for kind in WORKER_KINDS:
        queues = set(worker_queues(resources, kind))
        served = [t.name for t in get_tools(settings) if policies.for_tool(t.name).queue in queues]
        assert served, kind
        longest = max(
            policies.for_tool(n).time_limit + policies.for_tool(n).longest_retry_delay
            for n in served
        )
        spec = pod_spec(resources, kind)
        grace = spec["terminationGracePeriodSeconds"]
        assert grace >= math.ceil(longest + settings.redelivery_margin), (kind, grace, longest)
        (container,) = spec["containers"]
        live = container["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] > grace, kind


def test_the_service_grace_period_outlasts_its_drain(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given the service's Deployment, then its pods' grace period is the drain time (the
    runs go on) and 10 s more (those still going are handed on to another replica)."""
    _, resources = overlay
    spec = pod_spec(resources, "toolfleet-serve")
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert spec["terminationGracePeriodSeconds"] >= float(env["TOOLFLEET_DRAIN_SECONDS"]) + 10


def test_worker_probes_run_the_healthcheck_of_their_own_node(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given each worker Deployment, then readiness runs the full healthcheck (broker
    reachable, tools registered) and liveness its --live half, for the node name the
    worker's -n gives, and no probe imports the tool modules."""
    _, resources = overlay
    for kind in WORKER_KINDS:
        (container,) = pod_spec(resources, kind)["containers"]
        command = worker_command(resources, kind)
        node = command[command.index("-n") + 1]
        assert node == f"{kind}@%h"
        for probe, live in (("readinessProbe", False), ("livenessProbe", True)):
            line = container[probe]["exec"]["command"][-1]
            assert line.startswith("exec python -m tool_workers.health "), line
            assert f'"{kind}@$HOSTNAME"' in line
            assert ("--live" in line) is live, (kind, probe)


def test_serve_has_two_replicas_a_budget_and_probes_on_its_health_routes(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, resources = overlay
    deployment = kustomize.find(resources, "Deployment", "toolfleet-serve")
    assert deployment["spec"]["replicas"] >= 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (budget,) = of_kind(resources, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] >= 1
    routes = {getattr(r, "path", None) for r in system_routes.routes}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/ok"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {"/ok", "/ready"} <= routes
    service = kustomize.find(resources, "Service", "toolfleet-serve")
    assert service["spec"]["selector"].items() <= labels.items()


def test_pods_are_non_root_read_only_and_bounded(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given every pod, then each container has requests and limits, a read-only root
    filesystem, no privilege escalation and no capability but the sandbox's five; every
    pod runs as non-root except the sandbox worker (root for the switch to nobody)."""
    _, resources = overlay
    for deployment in of_kind(resources, "Deployment"):
        name = deployment["metadata"]["name"]
        spec = deployment["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        root = name == "sandbox-worker"
        assert spec["securityContext"]["runAsNonRoot"] is not root, name
        for container in spec["containers"]:
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), name
            assert {"cpu", "memory"} <= container["resources"]["limits"].keys(), name
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            added = set(security["capabilities"].get("add", []))
            sandbox = {"SETUID", "SETGID", "CHOWN", "KILL", "SYS_ADMIN"}
            assert added == (sandbox if root else set()), name


def test_the_sandbox_worker_gives_each_call_namespaces_of_its_own(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given the sandbox worker's pod, then its container may make each call's pid, mount
    and IPC namespaces: CAP_SYS_ADMIN, the runtime's default seccomp profile (which
    allows unshare and mount to a process holding it) and no AppArmor confinement (the
    runtime's default profile denies mount); and it accepts no weaker isolation
    (TOOLFLEET_SANDBOX_MIN_ISOLATION is not lowered)."""
    _, resources = overlay
    deployment = kustomize.find(resources, "Deployment", "sandbox-worker")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = [c for c in spec["containers"] if c["name"] == "worker"]
    security = container["securityContext"]
    assert "SYS_ADMIN" in security["capabilities"]["add"]
    assert security["appArmorProfile"]["type"] == "Unconfined"
    env = {v["name"]: v.get("value") for v in container.get("env", [])}
    assert env.get("TOOLFLEET_SANDBOX_MIN_ISOLATION") in (None, "namespaces"), env
    for config in of_kind(resources, "ConfigMap"):
        value = config["data"].get("TOOLFLEET_SANDBOX_MIN_ISOLATION")
        assert value in (None, "", "namespaces"), config["metadata"]["name"]


def test_every_image_is_pinned_to_a_version(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """Given an overlay, then every container's image names a tag that is not ``latest``
    (a rollout or a node pulling again runs what was tested), and toolfleet's own image
    is the package's version."""
    _, resources = overlay
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for workload in resources:
        if workload["kind"] not in kustomize.WORKLOADS:
            continue
        spec = workload["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            image = container["image"]
            name, _, tag = image.rpartition(":") if "@" not in image else (image, "", "digest")
            assert name and "/" not in tag and tag not in ("", "latest"), image
            if name.rsplit("/", 1)[-1] == "toolfleet":
                assert tag == version, image


def test_secrets_are_referenced_never_embedded(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given every resource, then none is a Secret, no environment variable named like a
    secret has a literal value, and no ConfigMap holds one."""
    _, resources = overlay
    assert not of_kind(resources, "Secret")
    for container in kustomize.containers(resources):
        for variable in container.get("env", []):
            if SECRET_NAMES.search(variable["name"]):
                assert "value" not in variable, variable
                assert variable["valueFrom"]["secretKeyRef"]["name"] == "toolfleet-secrets"
    for config in of_kind(resources, "ConfigMap"):
        assert not [k for k in config["data"] if SECRET_NAMES.search(k)], config["data"]


def test_sandbox_workers_reach_the_broker_and_nothing_else(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    """Given the network policies selecting the sandbox pods, then together they allow
    egress to name resolution and the broker's ports only, and everything else is denied
    by a policy selecting every pod."""
    _, resources = overlay
    policies = of_kind(resources, "NetworkPolicy")
    sandbox_labels = pod_spec_labels(resources, "sandbox-worker")
    deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert any(
        set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} and not p["spec"].get("egress")
        for p in deny
    )
    ports = set()
    for policy in policies:
        selector = policy["spec"]["podSelector"].get("matchLabels", {})
        if not selector.items() <= sandbox_labels.items():
            continue
        for rule in policy["spec"].get("egress", []):
            assert rule.get("to"), policy["metadata"]["name"]  # never "anywhere"
            ports |= {p["port"] for p in rule["ports"]}
    assert ports <= {53, 6379, 6380, 5671, 5672}, ports


def pod_spec_labels(resources: list[dict[str, Any]], name: str) -> dict[str, str]:
    labels: dict[str, str] = kustomize.find(resources, "Deployment", name)["spec"]["template"][
        "metadata"
    ]["labels"]
    return labels


def test_trial_redis_admits_toolfleets_pods_and_keda_only() -> None:
    resources = kustomize.render(REPO / "deploy" / "kubernetes" / "overlays" / "trial")
    policy = kustomize.find(resources, "NetworkPolicy", "redis")
    (rule,) = policy["spec"]["ingress"]
    sources = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert sources == [{"app.kubernetes.io/part-of": "toolfleet"}, {"app": "keda-operator"}]
    for deployment in of_kind(resources, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        toolfleet = deployment["metadata"]["name"] != "redis"
        assert (labels.get("app.kubernetes.io/part-of") == "toolfleet") is toolfleet
    assert "--requirepass" in pod_spec(resources, "redis")["containers"][0]["args"]


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nreplicas: []\n")
    with pytest.raises(ValueError, match="replicas"):
        kustomize.render(tmp_path)
