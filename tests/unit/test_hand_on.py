"""Where a worker sends a call it does not serve (tool_workers.celery_ext.hand_on)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tool_workers.celery_ext.hand_on import HandOn, NotServed
from tool_workers.contract.models import ToolSpec, WorkerEntry
from tool_workers.contract.names import HOPS_HEADER, MAX_HOPS, VERSION_HEADER, tool_queue
from tool_workers.contract.settings import Settings

OLD = ToolSpec(name="add", parameters={"properties": {"a": {}, "b": {}}})
NEW = ToolSpec(name="add", parameters={"properties": {"a": {}, "b": {}, "c": {}}})


def entry(worker: str, spec: ToolSpec) -> WorkerEntry:
    queue = tool_queue(spec.name, spec.version)
    assert queue is not None
    return WorkerEntry(worker=worker, pid=1, queues=["tools", queue], tools=[spec], updated_at=0)


def hand_on(served: dict[str, str], *entries: WorkerEntry) -> HandOn:
    found = HandOn(Settings(), served)
    found._entries = list(entries)  # the registry as read a moment ago
    found._read_at = time.monotonic()
    return found


def headers(**extra: Any) -> dict[str, Any]:
    return {"task": "tools.add", "id": "t-1", **extra}


def test_a_call_of_a_tool_served_here_at_its_version_runs_here() -> None:
    here = hand_on({"add": OLD.version}, entry("other", NEW))
    assert here.target(headers()) is None
    assert here.target(headers(**{VERSION_HEADER: OLD.version})) is None


def test_a_call_of_another_version_goes_to_that_versions_tool_queue() -> None:
    here = hand_on({"add": OLD.version}, entry("other", NEW))
    assert here.target(headers(**{VERSION_HEADER: NEW.version})) == tool_queue("add", NEW.version)
    # The version asked for is gone: this one runs it (the tool checks the arguments).
    gone = hand_on({"add": OLD.version})
    assert gone.target(headers(**{VERSION_HEADER: NEW.version})) is None


def test_a_tool_not_served_here_goes_to_a_live_worker_or_is_refused() -> None:
    elsewhere = hand_on({"echo": "x"}, entry("a", NEW), entry("b", NEW), entry("c", OLD))
    assert elsewhere.target(headers()) == tool_queue("add", NEW.version)  # most workers
    assert elsewhere.target(headers(**{VERSION_HEADER: OLD.version})) == tool_queue(
        "add", OLD.version
    )
    with pytest.raises(NotServed, match="no live worker serves 'add'"):
        hand_on({"echo": "x"}).target(headers())


@pytest.mark.parametrize("hops", [MAX_HOPS, MAX_HOPS + 5, "1", None, 1.5, True, [1]])
def test_hops_used_up_or_unreadable_end_the_hand_on(hops: Any) -> None:
    elsewhere = hand_on({}, entry("a", NEW))
    with pytest.raises(NotServed, match="handed on"):
        elsewhere.target(headers(**{HOPS_HEADER: hops}))
    # Served here (another version): it runs here rather than being refused.
    assert (
        hand_on({"add": OLD.version}, entry("a", NEW)).target(
            headers(**{HOPS_HEADER: hops, VERSION_HEADER: NEW.version})
        )
        is None
    )


@pytest.mark.parametrize("version", [None, 7, {"v": 1}, ["x"]])
def test_an_unreadable_version_header_means_any_version(version: Any) -> None:
    assert hand_on({"add": OLD.version}).target(headers(**{VERSION_HEADER: version})) is None


def test_other_tasks_are_not_handed_on() -> None:
    assert hand_on({}).target({"task": "celery.ping"}) is None
    assert hand_on({}).target({"task": 42}) is None
