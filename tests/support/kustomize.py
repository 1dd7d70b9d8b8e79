"""A small kustomize renderer for the subset deploy/kubernetes/ uses, so the tests render
the overlays as ``kubectl apply -k`` would, without kubectl.

Supported kustomization fields: ``resources`` (files, or directories holding a
kustomization.yaml), ``namespace``, ``labels`` (``pairs``, ``includeTemplates``),
``images`` (``name``, ``newName``, ``newTag``) and ``patches`` (``path`` to a strategic
merge patch matched by kind and name). Any other field is an error: a manifest using
more than this must extend the renderer (and its test) first.

The strategic merge is kustomize's for these resources: mappings merge key by key, a
list of mappings that all have a ``name`` merges item by item by name (containers, env,
volumes, ports), any other list is replaced (a CRD's lists, a NetworkPolicy's rules).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}

Resource = dict[str, Any]


def load_documents(path: Path) -> list[Resource]:
    """Every YAML document of a file, empty ones left out."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def render(directory: Path) -> list[Resource]:
    """The resources the kustomization in ``directory`` builds, in order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}: kustomization fields not supported: {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        resources.extend(render(target) if target.is_dir() else load_documents(target))
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only patches with a path are supported: {patch}")
        for document in load_documents(directory / patch["path"]):
            target_resource = find(resources, document["kind"], document["metadata"]["name"])
            merged = merge(target_resource, document)
            target_resource.clear()
            target_resource.update(merged)
    for label in kustomization.get("labels", []):
        if set(label) - {"pairs", "includeTemplates"}:
            raise ValueError(f"{directory}: label options not supported: {label}")
        for resource in resources:
            resource["metadata"].setdefault("labels", {}).update(label["pairs"])
            template = resource.get("spec", {}).get("template")
            if label.get("includeTemplates") and resource["kind"] in WORKLOADS and template:
                template.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in kustomization.get("images", []):
        if set(image) - {"name", "newName", "newTag"}:
            raise ValueError(f"{directory}: image options not supported: {image}")
        for container in containers(resources):
            name, _, _ = container["image"].partition(":")
            if name == image["name"]:
                new = image.get("newName", name)
                tag = image.get("newTag")
                container["image"] = f"{new}:{tag}" if tag else new
    if "namespace" in kustomization:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = kustomization["namespace"]
    return resources


def find(resources: list[Resource], kind: str, name: str) -> Resource:
    """The one resource of ``kind`` named ``name``."""
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    if len(found) != 1:
        raise KeyError(f"{len(found)} resources {kind}/{name}")
    return found[0]


def containers(resources: list[Resource]) -> list[dict[str, Any]]:
    """Every container of every workload's pod template."""
    found = []
    for resource in resources:
        if resource["kind"] in WORKLOADS:
            spec = resource["spec"]["template"]["spec"]
            found.extend(spec.get("initContainers", []) + spec["containers"])
    return found


def merge(base: Any, patch: Any) -> Any:
    """``patch`` merged into ``base`` (see the module docstring)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = copy.deepcopy(base)
        for item in patch:
            index = next((i for i, b in enumerate(out) if b["name"] == item["name"]), None)
            if index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = merge(out[index], item)
        return out
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)
