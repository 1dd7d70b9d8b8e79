"""``toolfleet serve`` against clients that hold its connections: slow heads, slow bodies,
endless headers, a flood of half-sent requests.

One server (the real CLI, SQLite checkpoints; no worker: no tool is called), with
short head and body timeouts and the open-file limit of a container (1024, or less where
this process may not hold that many sockets and more). The clients here are raw sockets
on loopback, bounded in count (the flood: 76 more than the server's open files) and
closed by the test; each test bounds time only where the bound is the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from orchestrator.server.keys import Keys
from orchestrator.server.records import RunRecord, now_iso
from orchestrator.server.store import Store
from tests.support.fleet import fleet_settings, wait_until
from tests.support.serving import TEST_MODEL, ServerProcess

pytestmark = pytest.mark.timeout(180)

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
OPEN_FILES = 1024
"""The server's open-file limit: a container's default."""
FLOOD_OVER = 76
"""Half-sent requests of the flood beyond the server's open-file limit."""
OWN_FILES = 200
"""Files this process keeps besides the flood's sockets (its clients, logs, pipes)."""
MAX_STREAMS = 6
"""Event streams one tenant may hold open."""
HISTORY = 3_000
"""Finished runs of the long thread."""


def server_open_files() -> int:
    """The server's open-file limit: :data:`OPEN_FILES`, or less where this process may
    not hold a flood that big (an ordinary user's hard limit of 1024). Raises this
    process's soft limit as far as the flood needs and its hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES + FLOOD_OVER + OWN_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY:
        return OPEN_FILES
    return min(OPEN_FILES, soft - FLOOD_OVER - OWN_FILES)


@pytest.fixture(scope="module")
def server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("abuse")
    settings = fleet_settings(redis_url, workdir).model_copy(
        update={
            "api_tokens": (
                f"alpha:tft-token-{uuid.uuid4().hex}",
                f"beta:tft-token-{uuid.uuid4().hex}",
            ),
            "model": TEST_MODEL,
            "checkpoint_path": workdir / "abuse.sqlite",
            "http_header_timeout": HEADER_TIMEOUT,
            "http_body_timeout": BODY_TIMEOUT,
            "tenant_max_streams": MAX_STREAMS,
        }
    )
    process = ServerProcess(
        settings, workdir, workdir / "abuse.log", open_files=server_open_files()
    )
    process.start()
    yield process
    process.stop()


def auth(server: ServerProcess, tenant: int = 0) -> dict[str, str]:
    token = server.settings.api_tokens[tenant].partition(":")[2]
    return {"Authorization": f"Bearer {token}"}


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


def test_ok_answers_during_a_flood_of_half_sent_requests(server: ServerProcess) -> None:
    """Given connections that each sent half a request head without a token, 76 more
    than the server has open files for (1,100 against a container's 1024), then ``/ok``
    and an authenticated request both answer meanwhile, and every flood connection is
    closed by the server once the head timeout has passed."""
    assert server.open_files is not None
    flood: list[socket.socket] = []
    try:
        for _ in range(server.open_files + FLOOD_OVER):
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
        first = b""
        while not first.endswith(b"}"):  # the whole answer: {"ok":true}
            first += sock.recv(65_536)
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
        head = (
            "POST /threads HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {auth(server)['Authorization']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"metadat')
        said = answer(sock, BODY_TIMEOUT + 5)
    assert said.startswith(b"HTTP/1.1 408 "), said[:80]
    after = httpx.post(f"{server.url}/threads/count", json={}, headers=auth(server)).json()
    assert after == before


def seed_history(
    server: ServerProcess,
    redis_url: str,
    thread_id: str,
    count: int,
    assistant_id: str = "agent",
) -> list[str]:
    """Record ``count`` finished runs of tenant alpha's thread, as the service does;
    answers their ids, the oldest first."""
    run_ids = [str(uuid.uuid4()) for _ in range(count)]

    async def seed() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        keys = Keys(server.settings.key_prefix)
        store = Store(client, keys, run_ttl=3600, thread_ttl=3600)
        try:
            for run_id in run_ids:
                stamp = now_iso()
                await store.put_run(
                    RunRecord(
                        run_id=run_id,
                        thread_id=thread_id,
                        assistant_id=assistant_id,
                        created_at=stamp,
                        updated_at=stamp,
                        status="success",
                        replica="gone",
                        tenant="alpha",
                    )
                )
        finally:
            await client.aclose()

    asyncio.run(seed())
    return run_ids


def commands_meanwhile(redis_url: str, namespace: str, seconds: float) -> int:
    """Redis commands naming keys of ``namespace`` during ``seconds`` (by MONITOR)."""
    client = redis.Redis.from_url(redis_url)
    counted = 0
    try:
        with client.monitor() as monitor:
            deadline = time.monotonic() + seconds
            for command in monitor.listen():
                if namespace in command["command"]:
                    counted += 1
                if time.monotonic() > deadline:
                    break
    finally:
        client.close()
    return counted


def commands_during(
    redis_url: str, namespace: str, action: Callable[[], object], names: set[str]
) -> list[str]:
    """Redis commands naming keys of ``namespace`` ending in one of ``names`` while
    ``action`` runs (by MONITOR, up to a marker command sent once it returned): those
    of other clients of the server (a stream of an earlier test) are not counted."""
    marker = f"{namespace}:monitor-end-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(redis_url)
    seen: list[str] = []
    try:
        with client.monitor() as monitor:
            action()
            client.get(marker)
            for command in monitor.listen():
                text = command["command"]
                if marker in text:
                    break
                keys = {word.rpartition(":")[2] for word in text.split() if namespace in word}
                if keys & names:
                    seen.append(text)
    finally:
        client.close()
    return seen


async def open_streams(
    http: httpx.AsyncClient, path: str, count: int, stack: contextlib.AsyncExitStack
) -> list[httpx.Response]:
    """``count`` streams of ``path``, open (their headers read) until ``stack`` closes."""
    return [await stack.enter_async_context(http.stream("GET", path)) for _ in range(count)]


def test_idle_thread_streams_cost_nothing_per_run_of_history(
    server: ServerProcess, redis_url: str
) -> None:
    """Given a thread with 3,000 finished runs and the most streams its tenant may hold
    open on it, none of them with anything to send, then in 3 s they make fewer than 300
    Redis commands (before, each look for a new run read every run record, one round
    trip each, twice a second), and another tenant's thread reads answer."""
    thread_id = f"long-{uuid.uuid4().hex[:8]}"
    created = httpx.post(
        f"{server.url}/threads", json={"thread_id": thread_id}, headers=auth(server)
    )
    assert created.status_code == 200
    seed_history(server, redis_url, thread_id, HISTORY)
    other = httpx.post(f"{server.url}/threads", json={}, headers=auth(server, 1)).json()

    async def scenario() -> tuple[int, int]:
        async with (
            httpx.AsyncClient(base_url=server.url, headers=auth(server), timeout=30) as http,
            contextlib.AsyncExitStack() as stack,
        ):
            opened = await open_streams(http, f"/threads/{thread_id}/stream", MAX_STREAMS, stack)
            assert {r.status_code for r in opened} == {200}
            await asyncio.sleep(1.0)  # past their first look
            counted = await asyncio.to_thread(
                commands_meanwhile, redis_url, server.settings.namespace, 3.0
            )
            read = httpx.get(
                f"{server.url}/threads/{other['thread_id']}", headers=auth(server, 1), timeout=30
            )
            return counted, read.status_code

    counted, status = asyncio.run(scenario())
    assert counted < 300, counted
    assert status == 200


def test_a_tenant_beyond_its_streams_is_429_and_others_are_not(server: ServerProcess) -> None:
    """Given a tenant holding its most streams (of a thread's and of a run's), then one
    more is a 429 with Retry-After; another tenant still opens one; and once one of the
    first tenant's streams closes, it may open another."""
    alpha = httpx.post(f"{server.url}/threads", json={}, headers=auth(server)).json()
    beta = httpx.post(f"{server.url}/threads", json={}, headers=auth(server, 1)).json()

    async def scenario() -> tuple[int, str | None, int, int]:
        async with (
            httpx.AsyncClient(base_url=server.url, headers=auth(server), timeout=30) as http,
            httpx.AsyncClient(base_url=server.url, headers=auth(server, 1), timeout=30) as other,
            contextlib.AsyncExitStack() as stack,
        ):
            path = f"/threads/{alpha['thread_id']}/stream"
            held = await open_streams(http, path, MAX_STREAMS - 1, stack)
            last = await http.send(http.build_request("GET", path), stream=True)
            assert {r.status_code for r in [*held, last]} == {200}
            refused = await http.get(path)
            async with other.stream("GET", f"/threads/{beta['thread_id']}/stream") as theirs:
                their_status = theirs.status_code
            await last.aclose()
            again = 0
            for _ in range(50):  # the server notices the client left
                async with http.stream("GET", path) as retry:
                    again = retry.status_code
                if again == 200:
                    break
                await asyncio.sleep(0.1)
            return refused.status_code, refused.headers.get("retry-after"), their_status, again

    refused, retry_after, theirs, again = asyncio.run(scenario())
    assert (refused, retry_after) == (429, "1")
    assert theirs == 200
    assert again == 200


def test_a_page_of_runs_costs_the_page_not_the_thread_history(
    server: ServerProcess, redis_url: str
) -> None:
    """Given a thread with 60 runs and one with 3,000, then a page of one run of either
    (``GET /threads/{id}/runs?limit=1``) and A2A ``tasks/get`` of the latest task cost
    the same few Redis commands (before, one read per run of the thread)."""
    assistant_id = str(uuid.uuid4())
    costs: dict[str, dict[int, int]] = {"runs": {}, "tasks/get": {}}
    for count in (60, HISTORY):
        thread_id = f"runs-{count}-{uuid.uuid4().hex[:8]}"
        created = httpx.post(
            f"{server.url}/threads", json={"thread_id": thread_id}, headers=auth(server)
        )
        assert created.status_code == 200
        run_ids = seed_history(server, redis_url, thread_id, count, assistant_id)
        newest = run_ids[-1]
        names = {*run_ids, f"alpha/{thread_id}"}
        answers: list[httpx.Response] = []

        def page(thread_id: str = thread_id, answers: list[httpx.Response] = answers) -> None:
            answers.append(
                httpx.get(
                    f"{server.url}/threads/{thread_id}/runs",
                    params={"limit": 1},
                    headers=auth(server),
                    timeout=30,
                )
            )

        def task(
            thread_id: str = thread_id,
            newest: str = newest,
            answers: list[httpx.Response] = answers,
        ) -> None:
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tasks/get",
                "params": {"id": f"{thread_id}:{newest}", "historyLength": 0},
            }
            answers.append(
                httpx.post(
                    f"{server.url}/a2a/{assistant_id}",
                    json=call,
                    headers={**auth(server), "Accept": "application/json"},
                    timeout=30,
                )
            )

        namespace = server.settings.namespace
        costs["runs"][count] = len(commands_during(redis_url, namespace, page, names))
        costs["tasks/get"][count] = len(commands_during(redis_url, namespace, task, names))
        listed, got = answers
        assert listed.status_code == 200, listed.text
        assert [r["run_id"] for r in listed.json()] == [newest]
        assert got.status_code == 200, got.text
        assert got.json()["result"]["id"] == f"{thread_id}:{newest}", got.text
    for surface, by_count in costs.items():
        assert by_count[HISTORY] == by_count[60], (surface, costs)
        assert by_count[HISTORY] <= 16, (surface, costs)


def test_a_request_on_a_connection_accepted_before_the_stop_is_answered(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Given two connections a replica accepted, one with no request yet and one with half
    a request head (a load balancer's, sent just before the replica was told to go), when
    the replica gets SIGTERM and stops listening, then the request each then carries is
    answered before the connection is closed, not cut unanswered; and the replica exits
    by itself well within its drain time."""
    workdir = tmp_path_factory.mktemp("stop")
    settings = fleet_settings(redis_url, workdir).model_copy(
        update={
            "api_tokens": (f"tft-token-{uuid.uuid4().hex}",),
            "model": TEST_MODEL,
            "checkpoint_path": workdir / "stop.sqlite",
            "drain_seconds": 20.0,
        }
    )
    process = ServerProcess(settings, workdir, workdir / "stop.log").start()
    fresh = connect(process)
    half = connect(process)
    try:
        half.sendall(b"GET /ok HTTP/1.1\r\n")
        # Answered on a third connection, made after the two: they were accepted before.
        assert httpx.get(f"{process.url}/ok", timeout=10).status_code == 200
        proc = process._proc
        assert proc is not None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                connect(process).close()
            except ConnectionRefusedError:
                return True
            return False

        wait_until(refused, timeout=10)
        fresh.sendall(b"GET /ok HTTP/1.1\r\nHost: replica\r\n\r\n")
        half.sendall(b"Host: replica\r\n\r\n")
        for sock in (fresh, half):
            said = answer(sock, 10)  # to the end: the replica closes the connection
            assert said.startswith(b"HTTP/1.1 200 "), said[:200]
        assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn ends on the signal it got
        assert time.monotonic() - t0 < settings.drain_seconds
    finally:
        fresh.close()
        half.close()
        process.stop()
