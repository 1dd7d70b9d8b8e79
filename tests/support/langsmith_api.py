"""A loopback stand-in for the LangSmith API that records the runs clients post.

It answers the ingestion endpoints the ``langsmith`` client uses: ``POST /runs``,
``PATCH /runs/<id>``, ``POST /runs/batch`` (JSON ``post``/``patch`` lists) and
``POST /runs/multipart`` (a ``multipart/form-data`` body whose parts are named
``post.<id>``, ``patch.<id>`` or ``post.<id>.<field>`` for the inputs, outputs and events
sent apart). Everything else (``/info`` included) is a 404, which the client reads as an
instance without optional features (no compression). Each run's create and update are
merged under its id.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from requests_toolbelt.multipart.decoder import MultipartDecoder


class RecordedRuns:
    """The runs posted so far, by id (create and update fields merged)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, Any]] = {}
        self.posts: list[str] = []
        """Run ids in the order their creates arrived (a duplicate create shows twice)."""

    def record(self, operation: str, run_id: str, fields: dict[str, Any]) -> None:
        with self._lock:
            if operation == "post" and not fields.get("__field"):
                self.posts.append(run_id)
            fields = {k: v for k, v in fields.items() if k != "__field"}
            self._runs.setdefault(run_id, {"id": run_id}).update(fields)

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(run) for run in self._runs.values()]


def _handler(recorded: RecordedRuns) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, payload: Any = None) -> None:
            data = json.dumps(payload if payload is not None else {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._body()
            self._answer(404, {"detail": "not found"})

        def do_POST(self) -> None:
            body = self._body()
            path = self.path.split("?")[0].rstrip("/")
            if path.endswith("/runs/multipart"):
                self._multipart(body, self.headers.get("Content-Type", ""))
            elif path.endswith("/runs/batch"):
                payload = json.loads(body)
                for operation in ("post", "patch"):
                    for run in payload.get(operation) or []:
                        recorded.record(operation, str(run["id"]), run)
            elif path.endswith("/runs"):
                run = json.loads(body)
                recorded.record("post", str(run["id"]), run)
            else:
                self._answer(404, {"detail": "not found"})
                return
            self._answer(202)

        def do_PATCH(self) -> None:
            body = self._body()
            run_id = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
            recorded.record("patch", run_id, json.loads(body))
            self._answer(202)

        def _multipart(self, body: bytes, content_type: str) -> None:
            for part in MultipartDecoder(body, content_type).parts:
                disposition = part.headers.get(b"Content-Disposition", b"").decode()
                name = disposition.split('name="', 1)[1].split('"', 1)[0]
                operation, run_id, *field = name.split(".")
                if operation not in ("post", "patch"):
                    continue  # feedback, attachments
                value = json.loads(part.content)
                if field:
                    recorded.record(operation, run_id, {field[0]: value, "__field": True})
                else:
                    recorded.record(operation, run_id, value)

    return Handler


@contextmanager
def langsmith_api() -> Iterator[tuple[str, RecordedRuns]]:
    """Serve the stand-in on a free loopback port; its URL and what it records."""
    recorded = RecordedRuns()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorded))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", recorded
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
