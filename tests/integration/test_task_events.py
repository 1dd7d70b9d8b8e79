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
