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


def _capture(app: Any, task_id: str, last: str) -> tuple[list[dict[str, Any]], threading.Event]:
    """The task events of ``task_id`` as a receiver gets them (a thread listening from
    now), and an event set once the one of type ``last`` has come."""
    events: list[dict[str, Any]] = []
    ready, done = threading.Event(), threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event.get("uuid") == task_id:
            events.append(event)
            if event["type"] == last:
                done.set()

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": on_event})
            ready.set()
            for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
                if done.is_set():
                    return

    threading.Thread(target=listen, daemon=True).start()
    assert ready.wait(10)
    return events, done


def test_a_calls_task_events_reach_a_receiver(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a prefork worker with task events on and a receiver listening, when a call
    runs, then the receiver gets its received, started and succeeded events."""
    settings = make_settings()
    start_worker(settings, pool="prefork", concurrency=2, queues=("tools",), events=True)
    app = create_app(settings)
    call_id = f"call-{uuid.uuid4().hex[:8]}"
    task_id = task_id_for(call_id)
    events, done = _capture(app, task_id, "task-succeeded")
    dispatcher = dispatcher_for(settings=settings)
    spec = dispatcher.served_tools(fresh=True)["echo_cls"]
    call = PreparedCall(
        tool="echo_cls", call_id=call_id, args={"text": "hi"}, task_id=task_id,
        queue=spec.queue, spec=spec,
    )  # fmt: skip
    dispatcher.submit([call])
    assert dispatcher.wait(call, timeout=30).status == "success"
    assert done.wait(10), events
    assert {"task-received", "task-started", "task-succeeded"} <= {e["type"] for e in events}
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
    call_id = f"call-{uuid.uuid4().hex[:8]}"
    task_id = task_id_for(call_id)
    events, done = _capture(app, task_id, "task-failed")
    dispatcher = dispatcher_for(settings=settings)
    spec = dispatcher.served_tools(fresh=True)["boom"]
    call = PreparedCall(
        tool="boom", call_id=call_id, args={"reason": "redis://:hunter2@db:6379/0"},
        task_id=task_id, queue=spec.queue, spec=spec,
    )  # fmt: skip
    dispatcher.submit([call])
    assert dispatcher.wait(call, timeout=30).status == "error"
    assert done.wait(10)
    app.close()

    failed = next(event for event in events if event["type"] == "task-failed")
    shown = str(failed.get("traceback"))
    assert "fleet_tools.py" in shown and 'raise ValueError(f"boom: {reason}")' in shown, shown
    assert "ToolError" in shown  # and the failed task's own exception after it
    assert "hunter2" not in shown, shown
