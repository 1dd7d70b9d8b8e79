"""What the tests read from the rendered Kubernetes manifests: each worker kind's command
and queues, and the settings the pods run with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import kustomize
from tool_workers.contract.settings import Settings

OVERLAYS = ("trial", "production", "rabbitmq")
WORKER_KINDS = ("tool-worker", "sandbox-worker")
"""The worker Deployments (each its own kind: its node name before ``@``)."""


def worker_command(resources: list[dict[str, Any]], kind: str) -> list[str]:
    (container,) = kustomize.find(resources, "Deployment", kind)["spec"]["template"]["spec"][
        "containers"
    ]
    return [str(part) for part in container["command"]]


def worker_queues(resources: list[dict[str, Any]], kind: str) -> list[str]:
    """The queues a worker Deployment's ``-Q`` names."""
    command = worker_command(resources, kind)
    return command[command.index("-Q") + 1].split(",")


def trigger_key(resources: list[dict[str, Any]], kind: str) -> tuple[str, str]:
    """The trigger type and the list (or queue) the kind's ScaledObject watches."""
    for scaled in resources:
        if scaled["kind"] == "ScaledObject" and scaled["spec"]["scaleTargetRef"]["name"] == kind:
            (trigger,) = scaled["spec"]["triggers"]
            meta = trigger["metadata"]
            return str(trigger["type"]), str(meta.get("listName") or meta["queueName"])
    raise KeyError(kind)


def deployment_settings(
    resources: list[dict[str, Any]], workdir: Path, **overrides: Any
) -> Settings:
    """Settings as the pods have them: the env ConfigMap's namespace and the policy file
    the pods mount (written under ``workdir``); the broker from the overlay's trigger
    type unless ``overrides`` give one."""
    env = kustomize.find(resources, "ConfigMap", "toolfleet-env")["data"]
    policy = kustomize.find(resources, "ConfigMap", "toolfleet-policy")["data"]["toolfleet.toml"]
    path = workdir / "toolfleet.toml"
    path.write_text(policy)
    kind, _ = trigger_key(resources, "tool-worker")
    values: dict[str, Any] = {
        "namespace": env.get("TOOLFLEET_NAMESPACE", ""),
        "config": path,
        "workspace_root": workdir / "workspace",
        "tool_modules": (),
    }
    if kind == "rabbitmq":
        values["broker_url"] = "amqp://guest:guest@127.0.0.1:5672//"
        values["redis_url"] = "redis://127.0.0.1:6379/0"
    values.update(overrides)
    return Settings(**values)
