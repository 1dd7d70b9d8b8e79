"""Task events (``-E``) still reach their receivers (Flower) when a worker sends a call's
events together (:data:`tool_workers.celery_ext.consumer.EVENTS_FLUSH`)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from tool_workers.contract.broker import create_app
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings


def test_a_calls_task_events_reach_a_receiver(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a prefork worker with task events on and a receiver listening, when a call
    runs, then the receiver gets its received, started and succeeded events."""
    settings = make_settings()
    start_worker(settings, pool="prefork", concurrency=2, queues=("tools",), events=True)
    app = create_app(settings)
    seen: dict[str, list[str]] = {}
    ready = threading.Event()
    done = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        seen.setdefault(str(event.get("uuid")), []).append(str(event["type"]))
        if "task-succeeded" in seen.get(task_id, []):
            done.set()

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": on_event})
            ready.set()
            for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
                if done.is_set():
                    return

    call_id = f"call-{uuid.uuid4().hex[:8]}"
    task_id = task_id_for(call_id)
    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(10)
    dispatcher = dispatcher_for(settings=settings)
    spec = dispatcher.served_tools(fresh=True)["echo_cls"]
    call = PreparedCall(
        tool="echo_cls", call_id=call_id, args={"text": "hi"}, task_id=task_id,
        queue=spec.queue, spec=spec,
    )  # fmt: skip
    dispatcher.submit([call])
    assert dispatcher.wait(call, timeout=30).status == "success"
    assert done.wait(10), seen.get(task_id)
    assert {"task-received", "task-started", "task-succeeded"} <= set(seen[task_id])
    app.close()


def test_a_failed_calls_event_carries_the_tools_own_traceback_masked(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a tool that raises, when its call fails, then the task-failed event (what
    Flower shows) carries the tool's own traceback, down to the line that raised, with
    the password of a URL in its message masked; not only toolfleet's wrapper."""
    settings = make_settings()
    start_worker(settings, pool="prefork", concurrency=2, queues=("tools",), events=True)
    app = create_app(settings)
    failed: dict[str, Any] = {}
    ready = threading.Event()
    done = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "task-failed" and event.get("uuid") == task_id:
            failed.update(event)
            done.set()

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": on_event})
            ready.set()
            for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
                if done.is_set():
                    return

    call_id = f"call-{uuid.uuid4().hex[:8]}"
    task_id = task_id_for(call_id)
    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(10)
    dispatcher = dispatcher_for(settings=settings)
    spec = dispatcher.served_tools(fresh=True)["boom"]
    call = PreparedCall(
        tool="boom", call_id=call_id, args={"reason": "redis://:hunter2@db:6379/0"},
        task_id=task_id, queue=spec.queue, spec=spec,
    )  # fmt: skip
    dispatcher.submit([call])
    assert dispatcher.wait(call, timeout=30).status == "error"
    assert done.wait(10)
    listener.join(timeout=30)
    app.close()

    shown = str(failed.get("traceback"))
    assert "fleet_tools.py" in shown and 'raise ValueError(f"boom: {reason}")' in shown, shown
    assert "ToolError" in shown  # and the failed task's own exception after it
    assert "hunter2" not in shown, shown
