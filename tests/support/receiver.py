"""A webhook receiver on a loopback port: records every POST (headers and body) and
answers each with the next status of a script (then 200)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Delivery:
    """One POST the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.body)


class Receiver:
    """``http://127.0.0.1:<port>/...``, until :meth:`close`.

    Args:
        statuses: The statuses of the first POSTs, in order; later ones get 200.
    """

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.deliveries.append(
                        Delivery(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        """A URL of the receiver."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def wait_for(
        self, count: int, timeout: float = 30.0, path: str | None = None
    ) -> list[Delivery]:
        """The deliveries (to ``path``, or all) once there are ``count`` of them; then
        the list as it is at ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                got = [d for d in self.deliveries if path is None or d.path == path]
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.05)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
