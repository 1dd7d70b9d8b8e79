"""LangGraph's project file (``langgraph.json``): the graphs a server runs and their setup.

``toolfleet serve --config langgraph.json`` reads the file ``langgraph dev`` reads, so one
project runs under either server:

* ``graphs``: ``{"graph id": "./path/file.py:attr"}`` or ``"package.module:attr"`` (or
  ``{"path": ..., "description": ...}``). The attribute is a compiled graph, a
  ``StateGraph`` (compiled here), or a function returning either, called for each run
  (with the run's config when it takes an argument; it may be ``async``).
* ``dependencies``: local paths (``.``, ``./src``, relative to the file) put first on the
  import path. Package names there are for LangGraph's image build: they must already be
  installed here.
* ``env``: an env file (relative to the file) or a mapping. A variable the process
  environment already sets keeps its value, so a deployment can override the file.
  A relative ``TOOLFLEET_CONFIG`` there is relative to the file that sets it; with none
  set, the tool policy is ``config/toolfleet.toml`` beside the project file, if any.

* ``http.cors``: which browser pages may call the server (:mod:`orchestrator.server.cors`).

Other keys (``python_version``, ``dockerfile_lines``, the rest of ``http``, ...) concern
LangGraph's own build and platform, and are ignored.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.server.cors import CorsPolicy
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import DEFAULT_CONFIG_PATH


class _GraphEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")
    path: str
    description: str | None = None


class _HttpConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    cors: CorsPolicy | None = None


class _ProjectFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    graphs: dict[str, str | _GraphEntry]
    dependencies: list[str] = []
    env: str | dict[str, str] | None = None
    http: _HttpConfig | None = None


@dataclass(frozen=True)
class GraphSpec:
    """One entry of ``graphs``: where a graph is and what it is called."""

    graph_id: str
    """The graph's id (also its assistant's name when the graph has no name of its own)."""
    target: str
    """``./path/file.py:attr`` (relative to the project file) or ``package.module:attr``."""
    description: str | None = None
    """Description of its assistant."""


@dataclass(frozen=True)
class ProjectGraph:
    """A graph imported from a project: what to run, or what makes what to run."""

    spec: GraphSpec
    value: Any
    """A compiled graph (``Pregel``), or a function returning a graph."""
    takes_config: bool = False
    """Whether ``value`` is a function taking the run's config."""

    @property
    def is_factory(self) -> bool:
        """Whether a graph is made for each run."""
        return not isinstance(self.value, Pregel)


@dataclass(frozen=True)
class Project:
    """A parsed ``langgraph.json``."""

    path: Path
    """The project file (relative paths in it are relative to its folder)."""
    graphs: tuple[GraphSpec, ...]
    dependencies: tuple[Path, ...] = ()
    """Folders put first on the import path."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of the project (from its file or mapping)."""
    cors: CorsPolicy | None = None
    """``http.cors``: which browser pages may call the server."""

    def apply_env(self) -> None:
        """Set the project's environment variables the process does not set already.

        The tool policy file is found next to the project: ``TOOLFLEET_CONFIG`` from the
        project's env is relative to the file that sets it, and with none set anywhere
        ``config/toolfleet.toml`` beside the project file is used when it exists (never
        one that merely lies under the shell's current directory).
        """
        for name, value in self.env.items():
            os.environ.setdefault(name, value)
        if "TOOLFLEET_CONFIG" not in os.environ:
            beside = self.path.parent / DEFAULT_CONFIG_PATH
            if beside.is_file():
                os.environ["TOOLFLEET_CONFIG"] = str(beside)

    def load(self) -> list[ProjectGraph]:
        """Import every graph (after putting the dependencies on the import path).

        Raises:
            ConfigError: a graph's module or attribute cannot be imported, or is no graph.
        """
        for folder in reversed(self.dependencies):
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
        return [import_graph(spec, self.path.parent) for spec in self.graphs]


def read_project(path: str | Path) -> Project:
    """Parse a LangGraph project file.

    Raises:
        ConfigError: the file is missing, is not JSON, lacks ``graphs``, or names an env
            file that does not exist.
    """
    path = Path(path).resolve()
    try:
        parsed = _ProjectFile.model_validate(json.loads(path.read_text()))
    except OSError as exc:
        raise ConfigError(f"project file {path}: cannot read it ({exc})") from exc
    except (ValueError, ValidationError) as exc:
        raise ConfigError(f"project file {path}: not a LangGraph project ({exc})") from exc
    if not parsed.graphs:
        raise ConfigError(f"project file {path}: 'graphs' names no graph")
    base = path.parent
    graphs = tuple(
        GraphSpec(graph_id, entry)
        if isinstance(entry, str)
        else GraphSpec(graph_id, entry.path, entry.description)
        for graph_id, entry in parsed.graphs.items()
    )
    # "./src", ".", "/abs/dir" are folders; anything else names a package to install.
    dependencies = tuple(
        (base / dep).resolve() for dep in parsed.dependencies if dep.startswith((".", "/"))
    )
    cors = parsed.http.cors if parsed.http is not None else None
    return Project(path, graphs, dependencies, _env(parsed.env, base, path), cors)


def _env(value: str | dict[str, str] | None, base: Path, path: Path) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return _located(dict(value), base)
    from dotenv import dotenv_values

    env_file = (base / value).resolve()
    if not env_file.is_file():
        raise ConfigError(f"project file {path}: env file {env_file} not found")
    found = {k: v for k, v in dotenv_values(env_file).items() if v is not None}
    return _located(found, env_file.parent)


def _located(env: dict[str, str], base: Path) -> dict[str, str]:
    """``env`` with a relative ``TOOLFLEET_CONFIG`` made relative to ``base``, the folder
    of the file that names it (not the shell's current directory)."""
    named = env.get("TOOLFLEET_CONFIG")
    if named and not Path(named).is_absolute():
        env["TOOLFLEET_CONFIG"] = str((base / named).resolve())
    return env


def import_graph(spec: GraphSpec, base: Path) -> ProjectGraph:
    """Import the graph ``spec`` names (a file path relative to ``base``, or a module).

    Raises:
        ConfigError: it cannot be imported, or it is neither a graph nor a function
            taking at most one argument (the config).
    """
    location, sep, attribute = spec.target.rpartition(":")
    if not (sep and location and attribute):
        raise ConfigError(
            f"graph {spec.graph_id!r}: {spec.target!r} is not './path/file.py:attribute' "
            "or 'package.module:attribute'"
        )
    try:
        if "/" in location or location.endswith(".py"):
            module = _module_from_file(spec.graph_id, (base / location).resolve())
        else:
            module = importlib.import_module(location)
        value = getattr(module, attribute)
    except (ImportError, AttributeError, OSError) as exc:
        raise ConfigError(
            f"graph {spec.graph_id!r}: cannot import {spec.target!r} ({exc})"
        ) from exc
    if isinstance(value, StateGraph):
        value = value.compile()
    if isinstance(value, Pregel):
        return ProjectGraph(spec, value)
    if not callable(value):
        raise ConfigError(
            f"graph {spec.graph_id!r}: {spec.target!r} is a {type(value).__name__}, not a "
            "graph or a function returning one"
        )
    return ProjectGraph(spec, value, takes_config=_takes_config(spec, value))


def _module_from_file(graph_id: str, file: Path) -> Any:
    if not file.is_file():
        raise ImportError(f"no file {file}")
    # A name of its own, registered in sys.modules: pickling, dataclasses and typing
    # resolve the module's classes through it.
    name = re.sub(r"\W", "_", f"toolfleet_project_{graph_id}_{file.stem}")
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {file} as a module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _takes_config(spec: GraphSpec, factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if sum(p.default is p.empty for p in positional) > 1:
        raise ConfigError(
            f"graph {spec.graph_id!r}: the function {spec.target!r} needs more than one "
            "argument; it may take one, the run's config"
        )
    return bool(positional)
