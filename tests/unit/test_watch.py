"""The result listener's bookkeeping, without Redis: the watch table and the listener's
watch/release accounting."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.dispatch.listener import ResultListener
from orchestrator.dispatch.watch import PROGRESS, Watch, WatchTable
from tool_workers.contract.connections import async_redis_client
from tool_workers.contract.settings import Settings


def table_with(task_id: str, *callbacks: Any) -> tuple[WatchTable, Watch]:
    table = WatchTable()
    watch = Watch(concurrent.futures.Future())
    watch.on_state.extend(callbacks)
    table.watches[task_id] = watch
    return table, watch


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, dict[str, Any]]] = []

    def __call__(self, task_id: str, state: str | None, meta: dict[str, Any]) -> None:
        self.seen.append((task_id, state, meta))


def test_given_ready_state_when_delivered_then_future_resolves_with_meta() -> None:
    table, watch = table_with("t1")

    table.deliver("t1", json.dumps({"status": "SUCCESS", "result": {"content": "x"}}))

    assert watch.future.result(0)["result"] == {"content": "x"}


def test_given_started_then_success_when_delivered_then_observers_hear_each_change_once() -> None:
    recorder = Recorder()
    table, watch = table_with("t1", recorder)

    for state in ("STARTED", "STARTED", "SUCCESS"):
        table.apply("t1", {"status": state})

    assert [state for _, state, _ in recorder.seen] == ["STARTED", "SUCCESS"]
    assert watch.last_activity is not None


def test_given_unreadable_or_missing_raw_when_delivered_then_nothing_changes() -> None:
    table, watch = table_with("t1")

    table.deliver("t1", None)
    table.deliver("t1", b"{not json")

    assert not watch.future.done()


def test_given_resolved_watch_when_later_state_arrives_then_ignored() -> None:
    recorder = Recorder()
    table, watch = table_with("t1", recorder)
    table.apply("t1", {"status": "SUCCESS", "result": 1})

    table.apply("t1", {"status": "FAILURE", "result": 2})

    assert watch.future.result(0)["result"] == 1
    assert [state for _, state, _ in recorder.seen] == ["SUCCESS"]


def test_given_progress_batches_out_of_order_when_delivered_then_each_once_in_seq_order() -> None:
    recorder = Recorder()
    table, watch = table_with("t1", recorder)

    for seq in (1, 2, 2, 1, 3):
        table.deliver_reply(json.dumps({"task_id": "t1", "progress": [seq], "seq": seq}).encode())

    assert [meta["progress"] for _, state, meta in recorder.seen if state == PROGRESS] == [
        [1],
        [2],
        [3],
    ]
    assert watch.last_activity is not None


@pytest.mark.parametrize(
    "raw", [b"not json", b"[1, 2]", json.dumps({"task_id": 5}).encode(), b'{"status": "x"}']
)
def test_given_reply_channel_garbage_when_delivered_then_ignored(raw: bytes) -> None:
    table, watch = table_with("t1")

    table.deliver_reply(raw)

    assert not watch.future.done()


def test_given_reply_for_unwatched_call_when_delivered_then_ignored() -> None:
    table, watch = table_with("t1")

    table.deliver_reply(json.dumps({"task_id": "other", "status": "SUCCESS"}).encode())

    assert not watch.future.done()


def test_given_failing_observer_when_state_changes_then_future_still_resolves() -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("observer bug")

    table, watch = table_with("t1", broken)

    table.apply("t1", {"status": "SUCCESS"})

    assert watch.future.done()


@pytest.fixture
def listener() -> Iterator[ResultListener]:
    # Nothing listens on port 1: the listener thread keeps retrying its connection while
    # the bookkeeping under test runs in the caller's thread.
    made = ResultListener(
        lambda: async_redis_client("redis://127.0.0.1:1/0", Settings()),
        lambda task_id: f"celery-task-meta-{task_id}",
        reply_channel="toolfleet:reply:test",
    )
    yield made
    made.close()


def test_given_two_watches_of_one_call_when_released_once_then_still_watched(
    listener: ResultListener,
) -> None:
    first = listener.watch(["t1"])
    second = listener.watch(["t1"])
    assert first["t1"] is second["t1"]

    listener.release("t1")
    assert listener.pending() == 1 and not first["t1"].cancelled()

    listener.release("t1")
    assert listener.pending() == 0 and first["t1"].cancelled()


def test_given_release_of_unknown_call_then_nothing_happens(listener: ResultListener) -> None:
    listener.release("never-watched")

    assert listener.pending() == 0


def test_given_closed_listener_when_watching_then_refused(listener: ResultListener) -> None:
    futures = listener.watch(["t1", "t2"])
    listener.close()

    assert all(f.cancelled() for f in futures.values())
    with pytest.raises(RuntimeError):
        listener.watch(["t3"])
