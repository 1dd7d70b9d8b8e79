"""``toolfleet serve`` against clients that hold its connections: slow heads, slow bodies,
endless headers, a flood of half-sent requests.

One server (the real CLI, SQLite checkpoints; no worker: no tool is called), with
short head and body timeouts and the open-file limit of a container (1024). The clients
here are raw sockets on loopback, bounded in count (the flood: 1,100) and closed by the
test; each test bounds time only where the bound is the point.
"""

from __future__ import annotations

import resource
import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.fleet import fleet_settings
from tests.support.serving import TEST_MODEL, ServerProcess

pytestmark = pytest.mark.timeout(180)

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
OPEN_FILES = 1024
"""The server's open-file limit: a container's default."""
FLOOD = 1_100
"""Half-sent requests of the flood: more than the server has files for."""


@pytest.fixture(scope="module")
def server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("abuse")
    settings = fleet_settings(redis_url, workdir).model_copy(
        update={
            "api_tokens": (f"tft-token-{uuid.uuid4().hex}",),
            "model": TEST_MODEL,
            "checkpoint_path": workdir / "abuse.sqlite",
            "http_header_timeout": HEADER_TIMEOUT,
            "http_body_timeout": BODY_TIMEOUT,
        }
    )
    process = ServerProcess(settings, workdir, workdir / "abuse.log", open_files=OPEN_FILES)
    process.start()
    yield process
    process.stop()


def auth(server: ServerProcess) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def answer(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends before it closes the connection, within ``timeout``
    (``b""``: it closed, or reset, without a word); ``socket.timeout`` if it does not."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65_536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


@pytest.fixture(autouse=True)
def enough_files() -> None:
    """This process holds the flood's sockets: make sure it may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < FLOOD + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FLOOD + 200), hard))


def test_ok_answers_during_a_flood_of_half_sent_requests(server: ServerProcess) -> None:
    """Given 1,100 connections that each sent half a request head without a token (more
    than the server has open files for), then ``/ok`` and an authenticated request both
    answer meanwhile, and every flood connection is closed by the server once the head
    timeout has passed."""
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            sock = connect(server)
            sock.sendall(b"GET /threads HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            flood.append(sock)
        for _ in range(3):
            t0 = time.monotonic()
            assert httpx.get(f"{server.url}/ok", timeout=5).status_code == 200
            assert time.monotonic() - t0 < 5
        missing = httpx.get(f"{server.url}/threads/{uuid.uuid4()}", headers=auth(server))
        assert missing.status_code == 404
        deadline = time.monotonic() + HEADER_TIMEOUT + 15
        for sock in flood:
            said = answer(sock, max(0.1, deadline - time.monotonic()))
            assert said == b"" or said.startswith(b"HTTP/1.1 408 "), said[:80]
    finally:
        for sock in flood:
            sock.close()
    assert httpx.get(f"{server.url}/ok", timeout=5).status_code == 200


def test_a_request_head_that_stalls_is_408_and_closed(server: ServerProcess) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
        said = answer(sock, HEADER_TIMEOUT + 5)
    assert said.startswith(b"HTTP/1.1 408 ")


def test_a_kept_alive_connection_cannot_trickle_its_next_head(server: ServerProcess) -> None:
    """Given a connection that had one request answered, when it sends the start of a
    second head and stops, then the server closes it once the head timeout has passed
    (uvicorn's keep-alive timer stops at the first byte of the next request)."""
    with connect(server) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        first = sock.recv(65_536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /ok HTTP/1.1\r\nHo")
        t0 = time.monotonic()
        assert answer(sock, HEADER_TIMEOUT + 5) == b""
        assert time.monotonic() - t0 >= HEADER_TIMEOUT - 0.5


def test_an_endless_header_is_cut_off(server: ServerProcess) -> None:
    """Given a header that goes on for a mebibyte without ending, then the server stops
    reading it early (431, or the connection closed under the sender)."""
    with connect(server) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Long: ")
        sent = 0
        try:
            for _ in range(2**20 // 4096):
                sock.sendall(b"a" * 4096)
                sent += 4096
        except OSError:  # the server closed the connection after answering
            pass
        try:
            said = answer(sock, 5)
        except OSError:
            said = b""
    assert said == b"" or said.startswith(b"HTTP/1.1 431 "), said[:80]
    assert httpx.get(f"{server.url}/ok", timeout=5).status_code == 200


def test_a_body_that_stalls_is_408_and_stops_nothing_else(server: ServerProcess) -> None:
    """Given an authenticated POST that announces 100 bytes and sends 10, then the
    answer is a 408 once the body timeout has passed, and nothing was created."""
    before = httpx.post(f"{server.url}/threads/count", json={}, headers=auth(server)).json()
    with connect(server) as sock:
        token = server.settings.api_tokens[0]
        head = (
            f"POST /threads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"metadat')
        said = answer(sock, BODY_TIMEOUT + 5)
    assert said.startswith(b"HTTP/1.1 408 "), said[:80]
    after = httpx.post(f"{server.url}/threads/count", json={}, headers=auth(server)).json()
    assert after == before
