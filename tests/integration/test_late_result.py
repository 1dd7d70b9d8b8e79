"""A result the fence refuses is kept as its call's late result, heard and readable.

The worker side (its result store) and the orchestrator side (the note of a call
answered as lost, the late notice, the reader by thread) against a real Redis; the
network-fault trial is :mod:`tests.faults.test_net_late_result`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from rich.console import Console

from orchestrator.call import PreparedCall
from orchestrator.cli.late import run_late
from orchestrator.dispatch.late import LATE_OPENING, LateResult, LostCalls, late_results
from orchestrator.server import late as late_records
from orchestrator.server.keys import Keys
from orchestrator.server.store import Store
from tool_workers.celery_ext.fence import HOLDING_HEADER, held_key
from tool_workers.contract.broker import create_app
from tool_workers.contract.marker import marker_key
from tool_workers.contract.models import ToolResult
from tool_workers.contract.names import late_key, reply_channel
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(60)

TASK = "t-late-1"
THREAD = "thread-late"


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.backend_url)
    yield client
    client.close()


def stale_request(settings: Settings, channel: str) -> SimpleNamespace:
    """The request of an attempt whose call was handed on (another attempt's fence)."""
    return SimpleNamespace(
        reply_to=channel,
        task="tools.pay",
        hostname="w-stale",
        **{HOLDING_HEADER: [held_key(settings.key_prefix, "lapsed-lease"), "7"]},
    )


def wait_for(pubsub: redis.client.PubSub, within: float = 5.0) -> bytes:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.2)
        if message is not None and message["type"] == "message":
            return bytes(message["data"])
    raise AssertionError("no notice on the reply channel")


def test_a_result_refused_by_the_fence_is_kept_heard_and_read_by_thread(
    settings: Settings, client: redis.Redis
) -> None:
    """Given a call answered as lost (another attempt started it last, and answered that
    it may have partially run), when the stale attempt stores its real result, then the
    call's answer stays as it was, the result is kept as the call's late result (not
    replaced by the attempt's revocation after it), published as a late notice the
    orchestrator hears with the call's ids, and read by thread with its call id."""
    prefix = settings.key_prefix
    app = create_app(settings)
    io = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    lost = LostCalls(client, prefix, 600, io)
    heard: list[LateResult] = []
    lost.on_late(heard.append)
    channel = reply_channel(prefix, "late-test")
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    try:
        client.set(marker_key(prefix, TASK), json.dumps({"t": "x", "n": 2, "f": "other|1"}))
        call = PreparedCall(
            tool="pay", call_id="c-1", args={}, task_id=TASK, thread_id=THREAD, run_id="r-1"
        )
        lost.answered(call, ToolResult.error("redelivered", "may have partially run"))
        io.shutdown(wait=True)  # the note is written

        request = stale_request(settings, channel)
        # A state that is not a result is refused and nothing is kept.
        app.backend.store_result(TASK, {"hostname": "w-stale"}, "STARTED", request=request)
        assert client.get(late_key(prefix, TASK)) is None
        real = ToolResult(content="paid 7", worker="w-stale").model_dump(mode="json")
        app.backend.store_result(TASK, real, "SUCCESS", request=request)

        assert client.get(app.backend.get_key_for_task(TASK)) is None  # the answer stands
        notice = wait_for(pubsub)
        assert notice.startswith(LATE_OPENING)
        lost.heard(notice)
        # The stale attempt stopped afterwards: its revocation is not the call's outcome.
        app.backend.store_result(TASK, None, "REVOKED", request=request)
        with pytest.raises(AssertionError, match="no notice"):
            wait_for(pubsub, within=0.5)
        (read,) = late_results(client, prefix, THREAD)
    finally:
        pubsub.close()
        app.close()

    assert (read.call_id, read.tool, read.thread_id, read.run_id) == ("c-1", "pay", THREAD, "r-1")
    assert (read.answered, read.status, read.content) == ("redelivered", "success", "paid 7")
    assert abs(read.came_at - time.time()) < 30
    assert [(h.call_id, h.thread_id, h.content) for h in heard] == [("c-1", THREAD, "paid 7")]
    assert lost.heard_count == 1


def test_toolfleet_late_lists_a_threads_late_results_by_call_id(
    settings: Settings, client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given a call of a thread answered as lost and its late result kept, when the
    owner runs ``toolfleet late <thread>``, then it lists the late result by call id."""
    prefix = settings.key_prefix
    io = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    lost = LostCalls(client, prefix, 600, io)
    call = PreparedCall(tool="pay", call_id="c-9", args={}, task_id="t-9", thread_id=THREAD)
    lost.answered(call, ToolResult.error("worker_lost", "the worker stopped"))
    io.shutdown(wait=True)
    meta = {"status": "SUCCESS", "result": {"content": "paid 9"}, "task_id": "t-9"}
    client.set(late_key(prefix, "t-9"), json.dumps({"late_at": time.time(), "meta": meta}))

    assert run_late(settings, THREAD, as_json=True, console=Console()) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["call_id"], listed["answered"], listed["content"]) == (
        "c-9",
        "worker_lost",
        "paid 9",
    )
    run_late(settings, THREAD, as_json=False, console=Console(width=200))
    assert "c-9" in capsys.readouterr().out


def test_a_thread_without_calls_answered_as_lost_has_no_late_results(
    settings: Settings, client: redis.Redis
) -> None:
    """Given calls answered with their results, then nothing is noted for their thread."""
    io = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    lost = LostCalls(client, settings.key_prefix, 600, io)
    call = PreparedCall(tool="pay", call_id="c-2", args={}, task_id="t-2", thread_id=THREAD)
    lost.answered(call, ToolResult(content="paid"))
    io.shutdown(wait=True)
    assert late_results(client, settings.key_prefix, THREAD) == []


def test_a_late_notice_of_a_call_not_answered_as_lost_here_is_handed_on_unnamed(
    settings: Settings, client: redis.Redis
) -> None:
    """Given a late notice of a call this process did not answer as lost (an idempotent
    call rerun elsewhere, or one another process sent), then the hooks still get it, by
    task id, without a call id or an answer it was not given."""
    io = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    lost = LostCalls(client, settings.key_prefix, 600, io)
    heard: list[LateResult] = []
    lost.on_late(heard.append)
    meta = {"status": "SUCCESS", "result": {"content": "slept 3"}, "task_id": "t-x"}
    lost.heard(json.dumps({"late_at": 1.0, "meta": meta}).encode())
    io.shutdown(wait=True)
    assert [(h.task_id, h.call_id, h.answered, h.content) for h in heard] == [
        ("t-x", None, None, "slept 3")
    ]


def test_a_served_threads_late_result_is_listed_in_its_metadata_once(
    settings: Settings, client: redis.Redis
) -> None:
    """Given a thread of the HTTP service whose call was answered as lost, when the late
    result is heard (twice: a notice and, say, a replay), then the thread's metadata lists
    it once, with its call id, beside the metadata the thread had."""

    async def scenario() -> dict[str, Any]:
        strings = aioredis.Redis.from_url(settings.backend_url, decode_responses=True)
        store = Store(strings, Keys(settings.key_prefix), run_ttl=600, thread_ttl=600)
        io = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        lost = LostCalls(client, settings.key_prefix, 600, io)
        forget = late_records.install(lost, store, asyncio.get_running_loop())
        try:
            record, _ = await store.create_thread("alpha", "t-served", {"owner": "me"})
            call = PreparedCall(
                tool="pay", call_id="c-5", args={}, task_id="t-5", thread_id=record.key
            )
            lost.answered(call, ToolResult.error("redelivered", "may have partially run"))
            meta = {"status": "SUCCESS", "result": {"content": "paid 5"}, "task_id": "t-5"}
            notice = json.dumps({"late_at": 2.0, "meta": meta}).encode()
            for _ in range(2):
                await asyncio.to_thread(lost.heard, notice)
                await asyncio.sleep(0.2)
            thread = await store.thread(record.key)
            assert thread is not None
            return dict(thread.metadata)
        finally:
            forget()
            io.shutdown(wait=True)
            await strings.aclose()

    metadata = asyncio.run(scenario())
    assert metadata["owner"] == "me"
    (listed,) = metadata[late_records.METADATA_KEY]
    assert (listed["call_id"], listed["answered"], listed["content"]) == (
        "c-5",
        "redelivered",
        "paid 5",
    )
