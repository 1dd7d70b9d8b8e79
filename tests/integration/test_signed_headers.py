"""With ``TOOLFLEET_SIGNING_KEY``, what a client with broker access but no key can do to a
captured signed call by changing what the signature does not cover: Celery's headers,
the queue, and time (real Redis, real workers).

Each test captures (builds) a signed call message as the orchestrator publishes it,
changes it as such a client would, pushes it onto the queue itself, and checks that the
change has no effect: the worker's own policy decides time limits, retries, routing,
when the call runs, and whether it ran already.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.dispatch.envelope import redis_envelope, task_message
from orchestrator.local import WorkerProcess
from tests.support.fleet import effects, wait_until
from tests.support.wire import stored
from tool_workers.contract.failed import result_of_failure
from tool_workers.contract.marker import marker_key
from tool_workers.contract.models import ToolRequest
from tool_workers.contract.names import queue_key, reply_channel, task_id_for, task_name
from tool_workers.contract.settings import Settings
from tool_workers.contract.signing import sign_request

pytestmark = pytest.mark.timeout(120)

StartWorker = Callable[..., WorkerProcess]

KEY = "k-" + "fedcba9876543210" * 2


def prepared(tool: str, args: dict[str, Any], queue: str) -> PreparedCall:
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    return PreparedCall(
        tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id), queue=queue
    )


def push(
    client: redis.Redis, settings: Settings, call: PreparedCall, queue: str, **headers: Any
) -> None:
    """Publish ``call`` signed, as the orchestrator would, with ``headers`` changed."""
    message = task_message(call, reply_channel(settings.key_prefix, "tamper"), KEY)
    message.headers.update(headers)
    client.lpush(queue_key(settings.namespace, queue), redis_envelope(message, queue))


def starts(client: redis.Redis, settings: Settings, task_id: str) -> int:
    raw = client.get(marker_key(settings.key_prefix, task_id))
    return int(json.loads(raw).get("n", 0)) if raw else 0


def test_a_replay_with_a_higher_retry_number_does_not_run_a_finished_call_again(
    make_settings: Callable[..., Settings], start_worker: StartWorker, counter: redis.Redis
) -> None:
    """Given a signed non-idempotent call that ran, when its message is pushed again
    with ``retries: 5`` (as if Celery retried it), then the worker starts it (the start
    is counted) but does not run the tool a second time."""
    settings = make_settings(signing_key=KEY)
    start_worker(settings, name="tf-retries", pool="threads", concurrency=2, queues=("tools",))
    dispatcher = dispatcher_for(settings=settings)
    dispatcher.served_tools(fresh=True)
    call = prepared("charge", {"amount": 5}, "tools")
    push(counter, settings, call, "tools")
    assert stored(settings, call.task_id)["status"] == "SUCCESS"

    push(counter, settings, call, "tools", retries=5)
    wait_until(lambda: starts(counter, settings, call.task_id) >= 2, 30, "the replay started")
    time.sleep(0.5)

    assert list(effects(counter, settings, "charge").values()) == [1]


def test_the_time_limit_header_does_not_lift_the_policys_limit(
    make_settings: Callable[..., Settings], start_worker: StartWorker, counter: redis.Redis
) -> None:
    """Given ``hang``, limited to 4 s by the policy, when its signed call is pushed with
    ``timelimit: [60, 59]``, then it still ends at the policy's limit."""
    settings = make_settings(signing_key=KEY)
    start_worker(settings, name="tf-limits", pool="prefork", concurrency=1, queues=("prefork",))
    call = prepared("hang", {"seconds": 30}, "prefork")
    t0 = time.monotonic()
    push(counter, settings, call, "prefork", timelimit=[60, 59])

    meta = stored(settings, call.task_id, timeout=40)

    assert time.monotonic() - t0 < 25, "the 60 s limit of the header was applied"
    # Stored as the failed task Flower shows: a ToolTimeout carrying the call's answer.
    assert "time limit" in str(meta["result"]), meta


@pytest.mark.parametrize(
    "headers",
    [
        {"eta": "2999-01-01T00:00:00+00:00"},
        {"expires": "2000-01-01T00:00:00+00:00"},
    ],
    ids=["eta-delays", "expires-cancels"],
)
def test_eta_and_expires_headers_neither_delay_nor_cancel_a_signed_call(
    headers: dict[str, Any],
    make_settings: Callable[..., Settings],
    start_worker: StartWorker,
    counter: redis.Redis,
) -> None:
    """Given a signed call, when it is pushed with an ``eta`` far ahead or an ``expires``
    long past, then it runs now."""
    settings = make_settings(signing_key=KEY)
    start_worker(settings, name="tf-eta", pool="threads", concurrency=2, queues=("tools",))
    call = prepared("add", {"a": 2, "b": 3}, "tools")
    push(counter, settings, call, "tools", **headers)

    meta = stored(settings, call.task_id, timeout=20)

    assert meta["status"] == "SUCCESS" and meta["result"]["content"] == "5"


def test_a_signed_call_moved_to_a_queue_whose_worker_does_not_serve_it_is_not_run_there(
    make_settings: Callable[..., Settings], start_worker: StartWorker, counter: redis.Redis
) -> None:
    """Given ``hang``, routed to ``prefork`` by the policy, and a worker consuming only
    ``tools``, when a signed call of ``hang`` is pushed onto ``tools``, then that worker
    does not run it (no worker serving it is live: it is answered with an error)."""
    settings = make_settings(signing_key=KEY)
    start_worker(settings, name="tf-moved", pool="threads", concurrency=2, queues=("tools",))
    call = prepared("hang", {"seconds": 0.1}, "tools")
    push(counter, settings, call, "tools")

    meta = stored(settings, call.task_id, timeout=20)

    assert meta["status"] == "FAILURE"
    assert "no live worker serves 'hang'" in str(meta["result"])


def test_a_signed_request_replayed_after_its_redelivery_window_is_refused(
    make_settings: Callable[..., Settings], start_worker: StartWorker, counter: redis.Redis
) -> None:
    """Given a signed request of a non-idempotent call issued an hour ago (its start
    marker long expired), when it is pushed, then it is refused and the tool does not
    run; a request with no issue time is refused too."""
    settings = make_settings(signing_key=KEY)
    start_worker(settings, name="tf-replay", pool="threads", concurrency=2, queues=("tools",))
    results = {}
    for issued in (time.time() - 3600, None):
        call = prepared("charge", {"amount": 7}, "tools")
        body = ToolRequest(
            tool="charge", call_id=call.call_id, args=call.args, idempotency_key=call.task_id
        ).to_wire()
        if issued is not None:
            body["issued_at"] = issued
        message = task_message(call, reply_channel(settings.key_prefix, "tamper"), None)
        message.body[0][0] = sign_request(KEY, call.task_id, task_name("charge"), body)
        counter.lpush(queue_key(settings.namespace, "tools"), redis_envelope(message, "tools"))
        results[issued] = stored(settings, call.task_id, timeout=20)

    for meta in results.values():
        # An error result: a failed task carrying the result.
        assert meta["status"] == "FAILURE", meta
        result = result_of_failure(meta["result"])
        assert result is not None and result["status"] == "error", meta
        assert "issued" in result["content"]
    assert effects(counter, settings, "charge") == {}
