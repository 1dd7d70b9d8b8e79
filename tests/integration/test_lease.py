"""The lease, sweep, acknowledgement, start and store scripts against a real Redis.

No worker runs here: each test lays out what kombu and a worker write (an unacked
delivery, a holdings entry) under the test's own namespace and runs the scripts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from celery.worker import state as worker_state

from orchestrator.bench.delay_proxy import DelayProxy
from orchestrator.bench.links import proxied
from tests.support.fleet import wait_until
from tool_workers.celery_ext.backend import _STORE
from tool_workers.celery_ext.fence import (
    HOLDING_HEADER,
    START_SCRIPT,
    held_key,
    holding_token,
    parse_start,
    start_args,
)
from tool_workers.celery_ext.lease import Lease, held_entry, leases_key, stop_stale_calls
from tool_workers.contract.marker import CallMarker, marker_key
from tool_workers.contract.settings import Settings

TTL = 0.3


class Holding:
    """A request context carrying a delivery's holding, as the task sees it."""

    def __init__(self, held: str, tag: str) -> None:
        self.toolfleet_holding = [held, tag]


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(redis_url: str, settings: Settings) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    for key in c.scan_iter(f"{settings.namespace}:*"):
        c.delete(key)
    c.close()


class Clock:
    """A monotonic clock the test advances: the lease's own waits (a sweep held back)
    pass when the test says, not after a sleep."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def make_lease(
    client: redis.Redis, settings: Settings, clock: Callable[[], float] = time.monotonic
) -> Lease:
    return Lease(client, settings.key_prefix, f"{settings.namespace}:", TTL, 0.1, 60.0, clock)


def wait_lapsed(client: redis.Redis, settings: Settings, *leases: Lease) -> None:
    """Wait until each lease's deadline (its score, in Redis's milliseconds) has passed
    by Redis's clock: what a sweep reads to find it lapsed, one TTL after its last
    renewal."""
    key = leases_key(settings.key_prefix)

    def lapsed() -> bool:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        deadlines = [client.zscore(key, lease.id) for lease in leases]
        return all(d is not None and d < now_ms for d in deadlines)

    wait_until(lapsed, timeout=10 * TTL + 5, what="the leases' lapse")


def deliver(client: redis.Redis, settings: Settings, lease: Lease, tag: str, task: str) -> str:
    """What the transport writes for one delivery: kombu's unacked records and the
    holdings entry. Returns the queue's list key."""
    ns = f"{settings.namespace}:"
    queue = f"{ns}tools"
    raw = {"body": "e30=", "headers": {"id": task}, "properties": {"delivery_tag": tag}}
    held = lease.take(tag, task)
    client.hset(f"{ns}unacked", tag, json.dumps([raw, "tools", "tools"]))
    client.zadd(f"{ns}unacked_index", {tag: time.time()})
    client.hset(held, tag, held_entry(task, queue))
    return queue


def marker(client: redis.Redis, settings: Settings, task: str) -> CallMarker | None:
    return CallMarker.parse(client.get(marker_key(settings.key_prefix, task)))


def test_a_lapsed_lease_has_its_unacked_calls_moved_back_to_their_queue(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a worker holding two calls, one of them acknowledged, when its lease lapses,
    then a survivor's sweep puts the other back on its queue, marked redelivered, drops it
    from kombu's unacked records, and records that it was handed on."""
    lost, survivor = make_lease(client, settings), make_lease(client, settings)
    lost.tick()
    queue = deliver(client, settings, lost, "tag-1", "task-1")
    deliver(client, settings, lost, "tag-2", "task-2")
    ns = f"{settings.namespace}:"
    client.hdel(f"{ns}unacked", "tag-2")  # acknowledged
    assert survivor.tick() == []  # still alive
    wait_lapsed(client, settings, lost)

    assert survivor.tick() == ["task-1"]

    queued = [json.loads(item) for item in client.lrange(queue, 0, -1)]
    assert len(queued) == 1
    assert queued[0]["headers"] == {"id": "task-1", "redelivered": True}
    assert not client.hexists(f"{ns}unacked", "tag-1")
    assert client.zscore(f"{ns}unacked_index", "tag-1") is None
    handed = marker(client, settings, "task-1")
    assert handed is not None and handed.handed_on == lost.id
    assert not client.exists(lost.held)
    assert survivor.tick() == []  # moved once only


def test_a_worker_that_comes_back_after_its_lease_lapsed_takes_a_new_one(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a lease swept while its worker was unreachable, when the worker renews again,
    then it learns its calls were handed on, no longer acknowledges them, and renews a new
    lease under which a new delivery is held."""
    stale, survivor = make_lease(client, settings), make_lease(client, settings)
    stale.tick()
    deliver(client, settings, stale, "tag-1", "task-1")
    old_id = stale.id
    wait_lapsed(client, settings, stale)
    survivor.tick()
    # The call is delivered again, under the same tag, to the survivor.
    deliver(client, settings, survivor, "tag-1", "task-1")

    stale.tick()

    assert stale.id != old_id
    ns = f"{settings.namespace}:"
    assert stale.acknowledge("tag-1", f"{ns}unacked", f"{ns}unacked_index") is False
    assert client.hexists(f"{ns}unacked", "tag-1")  # the survivor's delivery is untouched
    assert client.zscore(leases_key(settings.key_prefix), stale.id) is not None
    assert survivor.acknowledge("tag-1", f"{ns}unacked", f"{ns}unacked_index") is True
    assert not client.hexists(f"{ns}unacked", "tag-1")


def test_a_renewed_lease_is_never_swept(client: redis.Redis, settings: Settings) -> None:
    """Given a worker renewing its lease more often than its TTL, its calls stay put."""
    worker, survivor = make_lease(client, settings), make_lease(client, settings)
    worker.tick()
    deliver(client, settings, worker, "tag-1", "task-1")
    for _ in range(6):
        time.sleep(TTL / 3)
        worker.tick()
        assert survivor.tick() == []
    assert client.hexists(worker.held, "tag-1")


def test_the_records_of_settled_deliveries_go_with_the_next_renewal(
    redis_url: str, client: redis.Redis, settings: Settings
) -> None:
    """Given a worker whose calls' results were stored (each store acknowledged its
    delivery), when its lease is next renewed, then their held records go in the same
    round trip as the renewal: a busy worker's lease costs no round trip more than an
    idle one's."""
    target = urlsplit(redis_url)
    with DelayProxy(target.hostname or "127.0.0.1", target.port or 6379, 0.0) as link:
        counted = redis.Redis.from_url(proxied(redis_url, link.port))
        clock = Clock()
        worker = make_lease(counted, settings, clock)
        worker.hold_sweeps()  # no sweep in these ticks: the renewal alone
        worker.tick()
        for n in range(3):
            deliver(client, settings, worker, f"tag-{n}", f"task-{n}")
        worker.settle("tag-0")
        worker.settle("tag-1")
        before, _ = link.exchanges.snapshot()

        assert worker.tick() == []

        after, _ = link.exchanges.snapshot()
        counted.close()
    assert after - before == 1
    assert client.hkeys(worker.held) == [b"tag-2"]


def start(client: redis.Redis, settings: Settings, task: str, request: object) -> object:
    keys, args = start_args(settings.key_prefix, task, 60, request, "", "")
    return parse_start(client.eval(START_SCRIPT, len(keys), *keys, *args))


def store(
    client: redis.Redis, task: str, value: str, fence: str, held: str = "", tag: str = ""
) -> int:
    """Run the result store script for delivery ``tag`` held in ``held`` (none: unfenced);
    ``fence`` is the call's marker key."""
    key = f"store-test:{task}"
    token = holding_token(held, tag) if held else ""
    keys = [key, fence, held, "", "", ""]
    return int(client.eval(_STORE, 6, *keys, value, 60, "store-test", token, tag)[0])


def test_only_the_attempt_that_started_last_stores_a_result(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a call started by a worker whose lease then lapsed, when another worker starts
    it again, then the second start writes the fence, and the first attempt's late store
    is refused while the second one's is written."""
    first, second = make_lease(client, settings), make_lease(client, settings)
    first.tick()
    second.tick()
    deliver(client, settings, first, "tag-1", "task-1")
    one = start(client, settings, "task-1", Holding(first.held, "tag-1"))
    assert (one.starts, one.handed_on, one.stale) == (1, False, False)  # type: ignore[attr-defined]
    wait_lapsed(client, settings, first)
    second.tick()  # sweeps the first
    first_held = held_key(settings.key_prefix, first.id)
    deliver(client, settings, second, "tag-1", "task-1")
    two = start(client, settings, "task-1", Holding(second.held, "tag-1"))
    assert (two.starts, two.handed_on) == (2, True)  # type: ignore[attr-defined]

    fence = marker_key(settings.key_prefix, "task-1")
    second_token = holding_token(second.held, "tag-1")
    started = marker(client, settings, "task-1")
    assert started is not None and started.fence == second_token
    assert (
        store(client, "task-1", '{"status": "SUCCESS", "n": 1}', fence, first_held, "tag-1") == -1
    )
    assert client.get("store-test:task-1") is None
    assert (
        store(client, "task-1", '{"status": "SUCCESS", "n": 2}', fence, second.held, "tag-1") == 1
    )
    assert json.loads(client.get("store-test:task-1") or b"")["n"] == 2
    client.delete("store-test:task-1")


def test_a_delivery_handed_on_before_it_started_does_not_start(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a call a worker had reserved when its lease lapsed, when that worker gets to
    start it after all, then the start is refused and not counted."""
    stale, survivor = make_lease(client, settings), make_lease(client, settings)
    stale.tick()
    deliver(client, settings, stale, "tag-1", "task-1")
    held = stale.held
    wait_lapsed(client, settings, stale)
    survivor.tick()

    refused = start(client, settings, "task-1", Holding(held, "tag-1"))

    assert refused.stale  # type: ignore[attr-defined]
    handed = marker(client, settings, "task-1")
    assert handed is not None and (handed.starts, handed.fence) == (0, "")


def test_a_delivery_without_a_holding_is_not_fenced(
    client: redis.Redis, settings: Settings
) -> None:
    """A start or store with no holding (no lease on that worker) is not fenced: the
    first answer stored wins."""
    begun = start(client, settings, "task-9", None)
    assert begun.starts == 1  # type: ignore[attr-defined]
    fence = marker_key(settings.key_prefix, "task-9")
    assert store(client, "task-9", '{"status": "SUCCESS", "n": 1}', fence) == 1
    assert store(client, "task-9", '{"status": "SUCCESS", "n": 2}', fence) == 0
    assert json.loads(client.get("store-test:task-9") or b"")["n"] == 1
    client.delete("store-test:task-9")


def test_a_call_handed_on_but_not_started_again_stores_its_late_result(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a call that finished on a worker cut off past its lease, when the worker
    stores its result on the heal before any other attempt started the call, then the
    store is written: the model gets the real result (the requeued delivery then finds
    it stored)."""
    stale, survivor = make_lease(client, settings), make_lease(client, settings)
    stale.tick()
    deliver(client, settings, stale, "tag-1", "task-1")
    held = stale.held
    start(client, settings, "task-1", Holding(held, "tag-1"))
    wait_lapsed(client, settings, stale)
    assert survivor.tick() == ["task-1"]  # handed on, not started again yet

    fence = marker_key(settings.key_prefix, "task-1")
    assert store(client, "task-1", '{"status": "SUCCESS", "n": 1}', fence, held, "tag-1") == 1
    assert json.loads(client.get("store-test:task-1") or b"")["n"] == 1
    client.delete("store-test:task-1")


def test_a_worker_that_could_not_renew_sweeps_no_lease_for_one_ttl(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a worker whose renewals failed (Redis was unreachable for everyone), when it
    renews again, then it sweeps no lapsed lease for one TTL: the others, back as well,
    renew theirs first and keep their calls."""
    clock = Clock()
    waking, other = make_lease(client, settings, clock), make_lease(client, settings)
    waking.tick()
    other.tick()
    deliver(client, settings, other, "tag-1", "task-1")
    wait_lapsed(client, settings, waking, other)  # both silent past their TTL

    waking.hold_sweeps()  # what a failed renewal does
    assert waking.tick() == []  # renewed, but no sweep yet
    other.tick()  # back too, before the grace passed: renewed, not swept

    assert client.hexists(other.held, "tag-1")
    clock.now += TTL + 0.1  # the grace has passed
    other.tick()
    assert waking.tick() == []  # sweeping again, and nothing lapsed
    other.expire()
    assert waking.tick() == ["task-1"]  # sweeping again indeed


def test_a_refusal_before_the_start_is_stored_only_while_its_delivery_is_held(
    client: redis.Redis, settings: Settings
) -> None:
    """Given a call refused before it started (a malformed request: no start wrote the
    fence), then its error is stored while the delivery is held, and refused once the
    delivery was handed on (the requeued delivery answers instead)."""
    worker, survivor = make_lease(client, settings), make_lease(client, settings)
    worker.tick()
    deliver(client, settings, worker, "tag-1", "task-1")
    deliver(client, settings, worker, "tag-2", "task-2")
    fence_1 = marker_key(settings.key_prefix, "task-1")
    fence_2 = marker_key(settings.key_prefix, "task-2")
    held = worker.held

    assert store(client, "task-1", '{"status": "SUCCESS"}', fence_1, held, "tag-1") == 1
    wait_lapsed(client, settings, worker)
    assert sorted(survivor.tick()) == ["task-1", "task-2"]  # neither acknowledged yet
    assert store(client, "task-2", '{"status": "SUCCESS"}', fence_2, held, "tag-2") == -1
    client.delete("store-test:task-1", "store-test:task-2")


class Running:
    """A running call as the consumer sees it (Celery's Request: id, request_dict)."""

    def __init__(self, task: str, held: str, tag: str) -> None:
        self.id = task
        self.request_dict = {HOLDING_HEADER: [held, tag]}
        self.stopped: list[str] = []

    def terminate(self, pool: Any, signal: str | None = None) -> None:
        self.stopped.append(str(signal))


def test_after_a_lapse_a_call_another_attempt_starts_later_is_stopped_here(
    client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a call running here under a lease that lapsed while no other attempt had
    started it (and the worker's own record of the delivery dropped, as a reconnect drops
    it), when another attempt starts the call after the heal, then the next check stops
    the execution here; before that, it runs on."""
    lease = make_lease(client, settings)
    held, tag, task = lease.held, "7", f"call-{time.monotonic_ns()}"
    marker = marker_key(settings.key_prefix, task)
    client.set(marker, json.dumps({"n": 1, "f": holding_token(held, tag)}))
    running = Running(task, held, tag)
    monkeypatch.setattr(worker_state, "active_requests", {running})
    lease.tick()  # registered
    client.zrem(leases_key(settings.key_prefix), lease.id)  # swept while cut off
    lease.tick()  # the lapse is seen

    stop_stale_calls(lease, pool=None)
    assert running.stopped == []  # no other attempt yet: it may still answer here

    client.set(marker, json.dumps({"n": 2, "f": "another-lease|3"}))
    stop_stale_calls(lease, pool=None)
    assert running.stopped == ["SIGKILL"]


def test_after_a_loss_a_copy_running_beside_its_original_here_is_not_stopped_with_it(
    client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a call running here when Redis lost its records (the lease gone with them),
    and its copy, published again, started on this same worker under the new lease,
    when the lease's check runs, then only the original execution is stopped: the copy
    (the attempt the marker names) runs on and answers."""
    lease = make_lease(client, settings)
    task = f"call-{time.monotonic_ns()}"
    lease.tick()  # registered
    original = Running(task, lease.take("7", task), "7")
    client.delete(leases_key(settings.key_prefix))  # Redis lost its records
    lease.tick()  # the lapse is seen; a new lease is taken
    copy = Running(task, lease.take("8", task), "8")
    marker = marker_key(settings.key_prefix, task)
    client.set(
        marker, json.dumps({"n": 1, "f": holding_token(copy.request_dict[HOLDING_HEADER][0], "8")})
    )
    monkeypatch.setattr(worker_state, "active_requests", {original, copy})

    stop_stale_calls(lease, pool=None)

    assert copy.stopped == []
    assert original.stopped == ["SIGKILL"]
