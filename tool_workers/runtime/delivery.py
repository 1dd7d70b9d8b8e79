"""Whether a delivery of a call may run here: its start, fenced, and what a start that is
not the call's first means.

The start script counts the start in the call's marker, only while the delivery is still
held (:mod:`tool_workers.celery_ext.fence`); it is run by the task body, or by the
consumer with the delivery's record (:class:`~tool_workers.celery_ext.fence.EarlyStart`).
A cancelled call, one handed on to another worker, and a redelivery after a crash (a
non-idempotent tool is not run again; an idempotent one at most
:data:`MAX_CRASH_REDELIVERIES` times) are answered here, as is a call whose records Redis
lost (:mod:`tool_workers.contract.epoch`).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from typing import Any

from celery import Task
from celery.exceptions import Ignore

from tool_workers.celery_ext.amqp_lease import dropped_unrun
from tool_workers.celery_ext.backend import reply_channel_of, state_meta
from tool_workers.celery_ext.fence import (
    RETRY_SCRIPT,
    START_SCRIPT,
    EarlyStart,
    Start,
    parse_start,
    start_args,
)
from tool_workers.contract.connections import run_script
from tool_workers.contract.epoch import (
    EpochWatch,
    epoch_of,
    note_loss,
    records_lost_text,
    renew_epoch,
)
from tool_workers.contract.failed import result_of_failure
from tool_workers.contract.models import ToolResult
from tool_workers.contract.settings import ToolPolicy
from tool_workers.observability.metrics import active as active_metrics

log = logging.getLogger("toolfleet.worker")

MAX_CRASH_REDELIVERIES = 2
"""How many times an idempotent call is run again after its worker died under it."""

STARTED_MEMORY = 8_192
"""Calls this process started, remembered to tell a lost marker from a first start (the
most recent ones: a redelivery comes within the redelivery window; about 1 MB)."""


def _count_loss() -> None:
    metrics = active_metrics()
    if metrics is not None:
        metrics.data_lost()


EPOCHS = EpochWatch("worker", _count_loss)
"""The epoch of toolfleet's records this process saw last."""


class StartedCalls:
    """The calls this process started (the most recent :data:`STARTED_MEMORY`): a call
    started here that comes back with no marker lost its marker, whatever the epoch."""

    def __init__(self, size: int = STARTED_MEMORY) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()

    def add(self, task_id: str) -> bool:
        """Note ``task_id`` as started; whether it had been started here before."""
        with self._lock:
            before = task_id in self._ids
            self._ids[task_id] = None
            self._ids.move_to_end(task_id)
            while len(self._ids) > self._size:
                self._ids.popitem(last=False)
        return before


STARTED = StartedCalls()


def _script(backend: Any, source: str) -> Any:
    """A script of toolfleet's, registered on the backend's client (loaded on first use)."""
    scripts = getattr(backend, "_toolfleet_scripts", None)
    if scripts is None:
        scripts = backend._toolfleet_scripts = {}
    script = scripts.get(source)
    if script is None:
        script = scripts[source] = backend.client.register_script(source)
    return script


def _start_script(backend: Any) -> Any:
    """The start script (:data:`START_SCRIPT`)."""
    return _script(backend, START_SCRIPT)


def retry_script(backend: Any) -> Any:
    """The retry note script (:data:`RETRY_SCRIPT`)."""
    return _script(backend, RETRY_SCRIPT)


def _how_lost(start: Start) -> str:
    if start.handed_on:
        return "its worker was lost or became unreachable (it stopped renewing its lease)"
    return "its worker stopped"


def _records_lost(task: Task, key_prefix: str, start: Start, since: int) -> bool:
    """Whether the call's records were lost after it was published or started here (its
    fate is unknown); a loss this process had not noticed yet is noted (``since``: the
    watch's generation when the start script was run)."""
    stamped = epoch_of(task.request)
    if start.epoch and EPOCHS.seen(
        start.epoch, missing=start.epoch_missing, stamped=stamped, since=since
    ):
        note_loss(
            task.backend.client,
            key_prefix,
            "worker",
            "the epoch key was missing" if start.epoch_missing else "the epoch changed",
            start.epoch,
        )
    if start.stale:
        return False
    again = STARTED.add(task.request.id)
    if again and start.starts == 1:
        # Started here before, and no marker counted it: the marker was lost (the call
        # may have been published again since). When the call had no marker and the
        # epoch does not show the loss (a replica promoted while behind), replace the
        # epoch: the call's copies elsewhere are refused too.
        if start.unknown or not start.unmarked or start.epoch != stamped:
            return True
        since = EPOCHS.generation
        try:
            epoch = renew_epoch(task.backend.client, key_prefix, start.epoch)
        except Exception as exc:  # refused here anyway
            log.warning("could not replace the epoch: %r", exc)
        else:
            if EPOCHS.lost_marker(epoch, since=since):
                note_loss(
                    task.backend.client, key_prefix, "worker", "a started call's marker", epoch
                )
        return True
    return start.unknown


def start_of(
    request: Any, key_prefix: str, lifetime: int, worker: str, announce: bool
) -> tuple[list[str], list[Any]]:
    """The start script's keys and arguments for the delivery of ``request`` (its
    STARTED state announced on the caller's reply channel when it asked for progress)."""
    task_id = request.id
    channel = reply_channel_of(request) if announce else ""
    started = (
        json.dumps(
            state_meta(task_id, {"pid": os.getpid(), "hostname": worker}, "STARTED"),
            separators=(",", ":"),
        )
        if channel
        else ""
    )
    return start_args(
        key_prefix,
        task_id,
        lifetime,
        request,
        channel,
        started,
        worker,
        os.getpid(),
        check_epoch=EPOCHS.due(),
    )


def check_delivery(
    task: Task,
    key_prefix: str,
    lifetime: int,
    attempt: int,
    tool: str,
    policy: ToolPolicy,
    worker: str,
    announce: bool,
    early: EarlyStart | None = None,
) -> dict[str, Any] | None:
    """Count this start; refuse a cancelled call, or a redelivery that must not run
    (returns the result to give).

    One round trip (:data:`~tool_workers.celery_ext.fence.START_SCRIPT`) counts the
    start in the call's marker (fenced: only a delivery still held starts), reads whether
    the call was cancelled or handed on, and announces STARTED on the caller's reply
    channel when the caller asked for progress; none here when the consumer ran it
    already (``early``). A cancelled call is answered ``cancelled`` and never run.
    Celery retries raise the attempt number, so ``starts - attempt`` is how many times
    a worker died under this call.
    """
    task_id = task.request.id
    if early is not None and early.start is not None:
        start = early.start
        # A pool process's own watch, when the consumer's process started it.
        since = early.since if early.pid == os.getpid() else EPOCHS.generation
    else:
        since = EPOCHS.generation
        keys, args = start_of(task.request, key_prefix, lifetime, worker, announce)
        start = parse_start(
            run_script(task.backend.client, _start_script(task.backend), keys, args)
        )
    unknown = _records_lost(task, key_prefix, start, since)
    # A retries header above the retries a worker scheduled was written by someone else.
    attempt = min(attempt, start.scheduled + 1)
    if start.stale and dropped_unrun(task.request):
        # RabbitMQ: the call was handed on as a copy after its worker was lost, and this
        # is another delivery of it (the original RabbitMQ gave back, or one this worker
        # took before it was cut off): acknowledged unrun, nothing stored; the copy answers.
        log.warning(
            "call %s to %s was handed on as a copy after its worker was lost; dropped "
            "this other delivery of it unrun",
            task_id,
            tool,
        )
        raise Ignore()
    if start.stale:
        # Handed on to another worker while this one was unreachable; whatever this
        # returns is not stored (the fence names the other attempt).
        log.warning("call %s to %s was handed on to another worker; not running it", task_id, tool)
        return ToolResult.error(
            "worker_lost",
            f"Error: the call to '{tool}' was handed on to another worker.",
            worker=worker,
        ).to_wire()
    if start.revoked:
        # Cancelled while no live worker heard Celery's revoke broadcast.
        log.warning("call %s to %s was cancelled before it started; not running it", task_id, tool)
        return ToolResult.error(
            "cancelled",
            f"Error: the call to '{tool}' was cancelled before it started, and was not run.",
            worker=worker,
        ).to_wire()
    if unknown:
        if not policy.idempotent:
            log.error(
                "refused call %s to non-idempotent tool %s: Redis lost its records",
                task_id,
                tool,
            )
            return ToolResult.error("redelivered", records_lost_text(tool), worker=worker).to_wire()
        log.warning(
            "running call %s to idempotent tool %s, whose records Redis lost", task_id, tool
        )
        return None
    crashes = start.starts - attempt
    if crashes <= 0:
        return None
    stored = task.backend.get_task_meta(task_id)
    finished = stored.get("result") if stored.get("status") == "SUCCESS" else None
    if stored.get("status") == "FAILURE":
        finished = result_of_failure(stored.get("result"))
    if isinstance(finished, dict):
        # The call finished but its acknowledgement was lost: hand back the same result.
        log.warning("call %s to %s already finished; returning its stored result", task_id, tool)
        return dict(finished)
    if not policy.idempotent:
        log.error("refused redelivered call %s to non-idempotent tool %s", task_id, tool)
        return ToolResult.error(
            "redelivered",
            f"Error: the call to '{tool}' was interrupted when {_how_lost(start)}, and may "
            "have partially run. It was not run again because the tool is not idempotent.\n"
            " Check whether its effect happened before calling it again.",
            worker=worker,
        ).to_wire()
    if crashes > MAX_CRASH_REDELIVERIES:
        log.error("call %s to %s crashed its worker %d times; giving up", task_id, tool, crashes)
        return ToolResult.error(
            "worker_lost",
            f"Error: the call to '{tool}' stopped its worker {crashes} times and was not run "
            "again.\n Please fix your mistakes.",
            worker=worker,
        ).to_wire()
    log.warning("running redelivered call %s to idempotent tool %s again", task_id, tool)
    return None
