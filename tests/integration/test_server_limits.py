"""``toolfleet serve`` against careless and hostile clients: cheap refusals, bounded reads.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own, with a
small body limit. The requests here are ones no SDK sends: raw sockets where the point is
what the server reads (or does not read) of a request.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from orchestrator.server.guard import MAX_HEADER_BYTES, MAX_URL_BYTES
from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(120)

BODY_LIMIT = 65_536


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet, tmp_path_factory.mktemp("limits"), "limits", max_body_bytes=BODY_LIMIT
    )
    yield process
    process.stop()


def auth(server: ServerProcess) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}


def head(server: ServerProcess, method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_of(sock: socket.socket, timeout: float = 5.0) -> int:
    """The status code of the response the server sends on ``sock`` within ``timeout``."""
    sock.settimeout(timeout)
    received = b""
    while b"\r\n" not in received:
        chunk = sock.recv(4096)
        if not chunk:
            break
        received += chunk
    return int(received.split(b" ", 2)[1])


def test_a_huge_body_without_a_token_is_refused_before_it_is_sent(server: ServerProcess) -> None:
    """Given a POST announcing 300 MB without a token, when only its headers and 1 KB
    are sent, then the server answers 401 at once: it does not wait for the body."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        t0 = time.monotonic()
        sock.sendall(
            head(
                server,
                "POST",
                "/threads",
                {"Content-Type": "application/json", "Content-Length": str(300 * 2**20)},
            )
        )
        sock.sendall(b"{" * 1024)
        assert status_of(sock) == 401
    assert time.monotonic() - t0 < 5


def test_malformed_json_without_a_token_is_401(server: ServerProcess) -> None:
    response = httpx.post(
        f"{server.url}/threads/x/runs",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_body_over_the_limit_is_413_by_its_length_or_as_it_streams(
    server: ServerProcess,
) -> None:
    """Given a token, then a declared Content-Length over the limit is 413 before the
    body is sent, and a chunked body is cut off with 413 once it passes the limit, while
    the client still has megabytes to send."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        declared = {"Content-Type": "application/json", "Content-Length": str(BODY_LIMIT + 1)}
        sock.sendall(head(server, "POST", "/threads", {**auth(server), **declared}))
        assert status_of(sock) == 413

    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        chunked = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        sock.sendall(head(server, "POST", "/threads", {**auth(server), **chunked}))
        chunk = b" " * 16_384
        sent = 0
        sock.settimeout(5.0)
        refused = None
        for _ in range(2**20 // len(chunk)):  # up to 1 MB: 16 times the limit
            try:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            except OSError:  # the server closed the connection after answering
                break
            sent += len(chunk)
            if sent > BODY_LIMIT + len(chunk):
                refused = status_of(sock)
                break
        assert refused == 413
        assert sent < 2 * BODY_LIMIT

    small = httpx.post(f"{server.url}/threads", json={"metadata": {}}, headers=auth(server))
    assert small.status_code == 200


def test_long_urls_and_headers_are_refused_and_not_logged_whole(server: ServerProcess) -> None:
    """Given a URL just over the cap (with or without a token), then 414; headers over
    theirs, 431; and the server's access log holds only the start of the long path."""
    marker = uuid.uuid4().hex
    path = f"/threads/{marker}" + "a" * MAX_URL_BYTES
    for headers in ({}, auth(server)):
        t0 = time.monotonic()
        assert httpx.get(f"{server.url}{path}", headers=headers).status_code == 414
        assert time.monotonic() - t0 < 2
    big = {**auth(server), "X-Padding": "p" * (MAX_HEADER_BYTES + 1)}
    assert httpx.get(f"{server.url}/threads/x", headers=big).status_code == 431
    assert httpx.get(f"{server.url}/ok").status_code == 200
    log = server.log()
    assert marker in log and "a" * 1000 not in log


def test_ids_longer_than_the_cap_are_422_naming_the_field(server: ServerProcess) -> None:
    long_id = "t" * 300
    created = httpx.post(f"{server.url}/threads", json={"thread_id": long_id}, headers=auth(server))
    assert created.status_code == 422 and "thread_id" in created.json()["detail"]
    got = httpx.get(f"{server.url}/threads/{long_id}", headers=auth(server))
    assert got.status_code == 422 and "thread_id" in got.json()["detail"]
    run = httpx.post(
        f"{server.url}/runs/wait", json={"assistant_id": "a" * 300}, headers=auth(server)
    )
    assert run.status_code == 422 and "assistant_id" in run.json()["detail"]
