"""The MCP servers a worker serves, read from ``TOOLFLEET_MCP_SERVERS``.

The value is a JSON file's path or the JSON itself, in the ``mcpServers`` form MCP clients
keep: a stdio server has ``command`` (and ``args``, ``env``, ``cwd``), a streamable HTTP
server has ``url`` (and ``headers``)::

    {"mcpServers": {
        "files": {"command": "uvx", "args": ["mcp-server-git", "--repository", "/srv/repo"]},
        "search": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

The outer ``mcpServers`` object may be left out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tool_workers.contract.errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How to reach one MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = field(default=None, compare=False)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def transport(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if self.command is not None else "http"


def read_servers(value: str) -> dict[str, ServerConfig]:
    """The servers named by a ``TOOLFLEET_MCP_SERVERS`` value (a path or inline JSON).

    Raises:
        ConfigError: the file cannot be read, the JSON does not parse, or a server's entry
            has neither ``command`` nor ``url`` (or both), or a value of the wrong type.
    """
    text = value.strip()
    if not text.startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read TOOLFLEET_MCP_SERVERS file {value!r}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"TOOLFLEET_MCP_SERVERS is not JSON: {exc}") from exc
    if isinstance(data, dict) and "mcpServers" in data:
        data = data["mcpServers"]
    if not isinstance(data, dict):
        raise ConfigError("TOOLFLEET_MCP_SERVERS must hold an object of servers by name")
    return {name: _server(name, entry) for name, entry in data.items()}


def _server(name: str, entry: Any) -> ServerConfig:
    where = f"TOOLFLEET_MCP_SERVERS server {name!r}"
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: a name is 1-64 letters, digits, '_', '.', '-'")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise ConfigError(f"{where} needs either 'command' (stdio) or 'url' (streamable HTTP)")
    args = entry.get("args", [])
    env, headers = entry.get("env"), entry.get("headers", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: 'args' must be a list of strings")
    for label, mapping in (("env", env or {}), ("headers", headers)):
        if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
        ):
            raise ConfigError(f"{where}: {label!r} must map strings to strings")
    if command is not None and not isinstance(command, str):
        raise ConfigError(f"{where}: 'command' must be a string")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ConfigError(f"{where}: 'url' must be an http(s) URL")
    return ServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=dict(env) if env is not None else None,
        cwd=entry.get("cwd"),
        url=url,
        headers=dict(headers),
    )
