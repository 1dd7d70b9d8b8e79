"""``toolfleet serve`` against careless and hostile clients: cheap refusals, bounded reads.

One server (the real CLI, SQLite checkpoints) over a prefork fleet of its own, with a
small body limit. The requests here are ones no SDK sends: raw sockets where the point is
what the server reads (or does not read) of a request.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from orchestrator.server.guard import MAX_HEADER_BYTES, MAX_URL_BYTES
from orchestrator.server.keys import Keys
from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

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


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Run input whose user message makes the test model call ``calls`` at once."""
    return {
        "messages": [{"role": "user", "content": json.dumps({"calls": [list(c) for c in calls]})}]
    }


async def finished_run(http: httpx.AsyncClient) -> tuple[str, str]:
    """A thread and a run on it that has finished."""
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    done = await http.post(
        f"/threads/{thread}/runs/wait", json={"assistant_id": "agent", "input": ask()}
    )
    assert done.status_code == 200
    runs = (await http.get(f"/threads/{thread}/runs")).json()
    return thread, runs[0]["run_id"]


async def streamed_values(http: httpx.AsyncClient) -> list[str]:
    """Stream a new run of one 0.3 s tool call; the event names received."""
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    body = {"assistant_id": "agent", "input": ask(("sleep_for", {"seconds": 0.3}))}
    events = []
    async with http.stream("POST", f"/threads/{thread}/runs/stream", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
    return events


@pytest.mark.parametrize("bad", ["99999999999999999999-0", "5_000", "\u0663-0", "1-2-3", "x"])
def test_a_bad_last_event_id_is_422_and_other_streams_go_on(
    server: ServerProcess, bad: str
) -> None:
    """Given a ``Last-Event-ID`` Redis would refuse as a stream id, then joining a run's
    stream with it is a 422, and a run streamed meanwhile gets all its parts."""

    async def scenario() -> tuple[int, list[str]]:
        async with httpx.AsyncClient(base_url=server.url, headers=auth(server)) as http:
            thread, run = await finished_run(http)
            headers = {"Last-Event-ID": bad.encode()}
            joined = await http.get(f"/threads/{thread}/runs/{run}/stream", headers=headers)
            return joined.status_code, await asyncio.wait_for(streamed_values(http), 30)

    status, events = asyncio.run(scenario())

    assert status == 422
    assert events[0] == "metadata" and "values" in events


def test_one_unreadable_event_log_does_not_stall_other_streams(
    server: ServerProcess, redis_url: str
) -> None:
    """Given a follower of a run whose event log Redis cannot read (the key holds a
    string), when another run is streamed meanwhile, then that stream gets all its
    parts, and the broken one ends instead of hanging."""
    client = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[list[str], list[str]]:
        async with httpx.AsyncClient(base_url=server.url, headers=auth(server), timeout=60) as http:
            thread, run = await finished_run(http)
            key = Keys(server.settings.key_prefix).events(run)
            client.delete(key)
            client.set(key, "not a stream", ex=600)
            broken: list[str] = []

            async def follow_broken() -> None:
                async with http.stream("GET", f"/threads/{thread}/runs/{run}/stream") as r:
                    async for line in r.aiter_lines():
                        if line.startswith("event: "):
                            broken.append(line.removeprefix("event: "))

            follower = asyncio.create_task(follow_broken())
            while not broken:
                await asyncio.sleep(0.05)
            events = await asyncio.wait_for(streamed_values(http), 30)
            await asyncio.wait_for(follower, 30)
            return broken, events

    try:
        broken, events = asyncio.run(scenario())
    finally:
        client.close()

    assert broken == ["metadata"]
    assert events[0] == "metadata" and "values" in events
