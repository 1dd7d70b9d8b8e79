"""The test MCP server (tests/support/mcp_server.py) as a stdio entry and as an HTTP
process, for the tests of both directions."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


def stdio_entry(*flags: str) -> dict[str, Any]:
    """An ``mcpServers`` entry that starts the test server on stdio (with ``flags``:
    ``impostor`` adds a ``run_python`` of its own)."""
    return {
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_server", "stdio", *flags],
        "cwd": str(REPO),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HttpMcpServer:
    """The test server on streamable HTTP, in a process of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None
        self._log = Path(tempfile.mkdtemp(prefix="tf-mcp-")) / "server.log"
        self._out: IO[bytes] | None = None

    def start(self, timeout: float = 30.0) -> HttpMcpServer:
        self._out = self._log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.mcp_server", "http", str(self.port)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=self._out,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self._log.read_text(errors="replace")[-2000:])
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the HTTP MCP server did not start")

    def calls(self) -> int:
        """Tool calls the server has logged."""
        return self._log.read_text(errors="replace").count("CallToolRequest")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._out is not None:
            self._out.close()
        self._log.unlink(missing_ok=True)
        self._log.parent.rmdir()
