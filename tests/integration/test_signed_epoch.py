"""With ``TOOLFLEET_SIGNING_KEY``, the epoch a call was published under is signed with its
request (real Redis, real workers).

A Redis client without the key captures a signed call's message from the queue, lets it
run, then deletes the call's marker and result and the epoch key (what a data loss
looks like), and re-sends the captured message to another worker with the epoch header
dropped, or changed to the epoch it wrote itself. Were the header not signed, the
worker would read the call as one from a client that stamps no epoch (or one of the
current epoch) and run the non-idempotent tool a second time.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.local import WorkerProcess
from tests.support.fleet import effects, wait_until
from tests.support.wire import stored
from tool_workers.contract.epoch import EPOCH_HEADER, epoch_key
from tool_workers.contract.failed import result_of_failure
from tool_workers.contract.marker import marker_key
from tool_workers.contract.names import queue_key, result_key, task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(150)

StartWorker = Callable[..., WorkerProcess]

KEY = "k-" + "0123456789abcdef" * 2


def prepared(tool: str, args: dict[str, Any]) -> PreparedCall:
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    return PreparedCall(
        tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id), queue="tools"
    )


@pytest.mark.parametrize("header", ["dropped", "changed"])
def test_a_replay_with_its_epoch_header_dropped_or_changed_is_refused_as_tampering(
    header: str, make_settings: Callable[..., Settings], start_worker: StartWorker
) -> None:
    """Given a signed non-idempotent call, published by the orchestrator and captured from
    the queue, that ran once, when a client without the key deletes its marker, its
    result and the epoch key, and pushes the captured message to another worker with the
    epoch header dropped, or set to the epoch the client wrote, then that worker refuses
    it as a request whose signature does not match, and the tool ran once."""
    settings = make_settings(signing_key=KEY)
    client = redis.Redis.from_url(settings.broker_url)
    queue = queue_key(settings.namespace, "tools")
    dispatcher = dispatcher_for(settings=settings)
    call = prepared("charge", {"amount": 9})
    try:
        with ThreadPoolExecutor(1) as pool:
            waited = pool.submit(dispatcher.wait, call, 60)
            captured = wait_until(lambda: client.lindex(queue, 0), 30, "the call's message")
            first = start_worker(settings, name="tf-epoch-a", pool="threads", queues=("tools",))
            assert waited.result(timeout=90).status == "success"
        first.stop(grace=5)
        assert list(effects(client, settings, "charge").values()) == [1]

        envelope = json.loads(captured)
        assert envelope["headers"].get(EPOCH_HEADER), envelope["headers"]
        client.delete(
            marker_key(settings.key_prefix, call.task_id),
            result_key(settings.namespace, call.task_id),
            epoch_key(settings.key_prefix),
        )
        if header == "dropped":
            del envelope["headers"][EPOCH_HEADER]
        else:
            forged = uuid.uuid4().hex
            client.set(epoch_key(settings.key_prefix), forged)
            envelope["headers"][EPOCH_HEADER] = forged
        start_worker(settings, name="tf-epoch-b", pool="threads", queues=("tools",))
        client.lpush(queue, json.dumps(envelope))

        meta = stored(settings, call.task_id)
        assert meta["status"] == "FAILURE", meta
        result = result_of_failure(meta["result"])
        assert result is not None and result["status"] == "error", meta
        assert "signature that does not match" in result["content"], result
        assert list(effects(client, settings, "charge").values()) == [1]
    finally:
        client.close()


def test_a_signed_call_retried_by_celery_keeps_its_signed_epoch(
    make_settings: Callable[..., Settings], start_worker: StartWorker, counter: redis.Redis
) -> None:
    """Given a signed call of a tool that fails twice with a transient error, when Celery
    retries it, then each retry carries the epoch its signature covers, and the third
    attempt succeeds."""
    settings = make_settings(signing_key=KEY)
    start_worker(settings, name="tf-epoch-retry", pool="threads", queues=("tools",))
    call = prepared("flaky", {"times": 2})

    result = dispatcher_for(settings=settings).wait(call, timeout=60)

    assert result.status == "success", result
    assert result.content == "ok after 3 attempts (attempt 3)"
    assert effects(counter, settings, "flaky")[call.task_id] == 3
