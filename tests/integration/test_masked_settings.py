"""Secrets in settings never reach a log: a worker serving inline MCP servers whose
entries carry an ``Authorization`` header and ``env`` keys, and ``toolfleet serve``
started with a webhook secret, log their settings at start with every secret masked."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import fleet_settings
from tests.support.mcp_servers import HttpMcpServer, stdio_entry
from tests.support.serving import start_server
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)


def _wait_for(read: Callable[[], str], text: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if text in got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_worker_with_inline_mcp_servers_logs_none_of_their_secrets(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given inline MCP servers, a streamable HTTP one named with a bearer token in its
    headers and a stdio one with secrets in its env, when a worker starts serving them,
    then its start banner lists the settings with none of those values in it."""
    bearer, pat = f"tft-bearer-{uuid.uuid4().hex}", f"tft-pat-{uuid.uuid4().hex}"
    server = HttpMcpServer().start()
    try:
        local = {**stdio_entry(), "env": {"GITHUB_PAT": pat, "PLAIN": pat[::-1]}}
        remote = {"url": server.url, "headers": {"Authorization": f"Bearer {bearer}"}}
        servers = {"mcpServers": {"local": local, "remote": remote}}
        settings = make_settings(tool_modules=(), mcp_servers=json.dumps(servers))
        worker = start_worker(settings, name="masked", pool="threads", concurrency=2)

        log = _wait_for(worker.log_file.read_text, "toolfleet settings")
    finally:
        server.stop()

    assert "toolfleet settings" in log and "mcp_servers" in log, log[-2000:]
    for secret in (bearer, pat, pat[::-1]):
        assert secret not in log


def test_serve_logs_its_settings_at_start_with_secrets_masked(
    redis_url: str, tmp_path: Path
) -> None:
    """Given ``toolfleet serve`` with a webhook secret and inline MCP servers with a
    header in its settings, when it starts, then its startup log lists the settings and
    shows neither."""
    secret = f"tft-hook-{uuid.uuid4().hex}"
    bearer = f"tft-bearer-{uuid.uuid4().hex}"
    servers = {"mcpServers": {"r": {"url": "http://127.0.0.1:9/mcp", "headers": {"X": bearer}}}}
    settings = fleet_settings(redis_url, tmp_path)
    server = start_server(
        settings,
        tmp_path,
        "masked",
        webhook_secret=secret,
        mcp_servers=json.dumps(servers),
    )
    try:
        log = _wait_for(server.log, "toolfleet settings")
    finally:
        server.stop()

    assert "toolfleet settings" in log and "mcp_servers" in log, log[-2000:]
    for value in (secret, bearer):
        assert value not in log
