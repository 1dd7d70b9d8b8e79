"""Webhooks of runs, against LangGraph's server: a run created with ``webhook`` has its
outcome POSTed there once, by ``toolfleet serve`` (signed, retried, refused for hosts not
allowed) and by ``langgraph dev``, to a loopback receiver both are told to allow."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.api_pair import PROJECT, ApiPair
from tests.support.langgraph_dev import LangGraphDev
from tests.support.receiver import Receiver
from tests.support.serving import prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(300)

SECRET = f"tft-webhook-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    ours = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("webhooks-toolfleet"),
        "webhooks",
        args=("--config", str(PROJECT)),
        model=None,
        webhook_allowed_hosts=("127.0.0.1:*",),
        webhook_secret=SECRET,
        webhook_attempts=3,
    )
    try:
        workdir = tmp_path_factory.mktemp("webhooks-lg")
        project = workdir / "project"
        shutil.copytree(PROJECT.parent, project, ignore=shutil.ignore_patterns("__pycache__"))
        # LangGraph's server refuses loopback webhooks unless its project file allows them.
        config = json.loads((project / PROJECT.name).read_text())
        config["webhooks"] = {"url": {"disable_loopback": False, "require_https": False}}
        (project / PROJECT.name).write_text(json.dumps(config))
        theirs = LangGraphDev(prefork_fleet, project / PROJECT.name, project, workdir / "lg.log")
        theirs.start(timeout=120.0)
    except BaseException:
        ours.stop()
        raise
    try:
        yield ApiPair(ours, theirs)
    finally:
        theirs.stop()
        ours.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    try:
        yield found
    finally:
        found.close()


def test_a_finished_run_is_posted_to_its_webhook_once(pair: ApiPair, receiver: Receiver) -> None:
    """Given a receiver, when a stateful and a stateless run name it as their webhook,
    then on both servers each run is POSTed there once, as the run with its final status
    and values; toolfleet's payload has every field LangGraph's has."""

    async def scenario(c: Any) -> dict[str, Any]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        tag = uuid.uuid4().hex[:8]
        hook, loose = receiver.url(f"/t-{tag}"), receiver.url(f"/s-{tag}")
        await c.runs.wait(tid, "made", input={}, webhook=hook)
        await c.runs.wait(None, "made", input={}, webhook=loose)
        stateful = await asyncio.to_thread(receiver.wait_for, 1, 30.0, f"/t-{tag}")
        stateless = await asyncio.to_thread(receiver.wait_for, 1, 30.0, f"/s-{tag}")
        await asyncio.sleep(1.0)  # a second delivery would come by now
        return {
            "thread_id": tid,
            "stateful": [d.json() for d in receiver.wait_for(1, 0, f"/t-{tag}")],
            "stateless": [d.json() for d in receiver.wait_for(1, 0, f"/s-{tag}")],
            "headers": stateful[0].headers if stateful else {},
            "raw": stateful[0].body if stateful else b"",
            "got": (len(stateful), len(stateless)),
        }

    ours, theirs = pair.both(scenario)

    for result in (ours, theirs):
        assert result["got"] == (1, 1), result
        assert len(result["stateful"]) == 1 and len(result["stateless"]) == 1, result
        body = result["stateful"][0]
        assert body["thread_id"] == result["thread_id"]
        assert body["status"] == "success"
        assert body["values"]["seen"] == "made" and body["values"]["runs"] == 1, body
        assert result["stateless"][0]["status"] == "success", result
    # A run on a thread of its own: toolfleet sends the values the run left (read before
    # the thread is deleted); LangGraph's server sends null there.
    assert ours["stateless"][0]["values"]["runs"] == 1, ours
    assert theirs["stateless"][0]["values"] is None, theirs
    # Its LangSmith tracing project: toolfleet's runs have none.
    missing = set(theirs["stateful"][0]) - set(ours["stateful"][0]) - {"langsmith_session_name"}
    assert not missing, f"fields LangGraph's server sends and toolfleet does not: {missing}"
    # toolfleet's is signed: the receiver recomputes the HMAC over the raw body.
    expected = "sha256=" + hmac.new(SECRET.encode(), ours["raw"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(ours["headers"]["x-toolfleet-signature"], expected)
    assert ours["headers"]["x-toolfleet-delivery"] == ours["stateful"][0]["run_id"]


SLOW = {
    "messages": [
        {"role": "user", "content": json.dumps({"calls": [["sleep_for", {"seconds": 20}]]})}
    ]
}


def test_a_cancelled_runs_webhook_says_it_was_interrupted(
    pair: ApiPair, receiver: Receiver
) -> None:
    """Given a run in its tool call that names a webhook, when it is cancelled, then
    on both servers the webhook says ``interrupted`` and carries the cancellation as
    its error, the same on both."""

    async def scenario(c: Any) -> dict[str, Any]:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        path = f"/c-{uuid.uuid4().hex[:8]}"
        run = await c.runs.create(tid, "fleet", input=SLOW, webhook=receiver.url(path))
        while (await c.runs.get(tid, run["run_id"]))["status"] == "pending":
            await asyncio.sleep(0.1)
        await c.runs.cancel(tid, run["run_id"], wait=True)
        got = await asyncio.to_thread(receiver.wait_for, 1, 30.0, path)
        return got[0].json() if got else {}

    ours, theirs = pair.both(scenario)

    assert ours["status"] == theirs["status"] == "interrupted", (ours, theirs)
    assert ours["error"] == theirs["error"], (ours, theirs)
    assert ours["error"]["error"] == "UserInterrupt", ours


def test_a_failing_receiver_is_retried_with_backoff(pair: ApiPair, receiver: Receiver) -> None:
    """Given a receiver that answers 503 twice, when a run names it, then toolfleet
    tries a third time after waiting longer each time, and the run itself succeeded
    without waiting for the delivery."""
    receiver.statuses = [503, 503]
    server = pair.toolfleet
    headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        started = time.monotonic()
        answer = http.post(
            "/runs/wait", json={"assistant_id": "made", "input": {}, "webhook": receiver.url()}
        )
        answered = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        tries = receiver.wait_for(3, timeout=60)
    assert len(tries) == 3, [d.path for d in tries]
    assert len({d.body for d in tries}) >= 1
    assert len({d.headers["x-toolfleet-delivery"] for d in tries}) == 1
    gaps = [b.at - a.at for a, b in itertools.pairwise(tries)]
    assert gaps[0] >= 0.5 and gaps[1] >= gaps[0] * 0.9, gaps  # backoff: 1 s, then 2 s
    assert answered < gaps[0] + gaps[1], (answered, gaps)  # the run did not wait for them


def test_a_delivery_that_keeps_failing_is_counted(pair: ApiPair, receiver: Receiver) -> None:
    """Given a receiver that always answers 500, when a run names it, then after its 3
    tries the delivery counts as failed on /metrics, and the run is a success."""
    receiver.statuses = [500] * 10
    server = pair.toolfleet
    headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        before = _failed(http.get("/metrics").text)
        thread = http.post("/threads", json={}).json()["thread_id"]
        http.post(
            f"/threads/{thread}/runs/wait",
            json={"assistant_id": "made", "input": {}, "webhook": receiver.url()},
        ).raise_for_status()
        assert len(receiver.wait_for(3, timeout=60)) == 3
        deadline = time.monotonic() + 30
        while _failed(http.get("/metrics").text) < before + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _failed(http.get("/metrics").text) == before + 1
        runs = http.get(f"/threads/{thread}/runs").json()
        assert runs[0]["status"] == "success"
    time.sleep(1.0)
    assert len(receiver.deliveries) == 3  # no fourth try


def _failed(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('toolfleet_server_webhook_deliveries_total{outcome="failed"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.2:9/hook",  # loopback, not the one listed
        "http://10.1.2.3/hook",  # private
        "http://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "http://[::1]:8080/hook",  # loopback, IPv6
        "http://[::ffff:127.0.0.2]/hook",  # loopback, as an IPv4-mapped IPv6 address
        "ftp://example.com/hook",  # not http(s)
    ],
)
def test_a_webhook_to_a_host_not_allowed_is_a_422(pair: ApiPair, url: str) -> None:
    """Given only 127.0.0.1 allowed, when a run names a webhook on a loopback, private
    or link-local address (or not http), then the run is refused with a 422 naming
    ``webhook``, and no run or thread is left."""
    server = pair.toolfleet
    headers = {"Authorization": f"Bearer {server.settings.api_tokens[0]}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        thread = http.post("/threads", json={}).json()["thread_id"]
        answer = http.post(
            f"/threads/{thread}/runs", json={"assistant_id": "made", "input": {}, "webhook": url}
        )
        assert answer.status_code == 422, answer.text
        assert "webhook" in answer.json()["detail"], answer.text
        assert http.get(f"/threads/{thread}/runs").json() == []
