"""One Celery task per tool, named ``tools.<tool name>``.

The task body decodes the request, decides whether this delivery may run (a call that
comes back after its worker died is a redelivery: non-idempotent tools are not run
again), runs the tool, and retries transient failures through Celery so every attempt
shows in Flower. A call that ends in an error result ends as a failed task carrying that
result (:mod:`tool_workers.contract.failed`): Flower lists it under Failed, and the
orchestrator reads the result as it reads a success's.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task
from celery.exceptions import Ignore
from langchain_core.tools import BaseTool
from pydantic import ValidationError

from tool_workers.celery_ext.amqp_lease import dropped_unrun
from tool_workers.celery_ext.backend import reply_channel_of, state_meta
from tool_workers.celery_ext.fence import (
    RETRY_SCRIPT,
    START_SCRIPT,
    EarlyStart,
    Start,
    parse_start,
    start_args,
    take_early,
)
from tool_workers.contract.broker import RESTORE_INTERVAL, visibility_timeout
from tool_workers.contract.epoch import (
    EpochWatch,
    epoch_of,
    note_loss,
    records_lost_text,
    renew_epoch,
)
from tool_workers.contract.failed import ToolCallFailed, failure_of, result_of_failure
from tool_workers.contract.marker import marker_key
from tool_workers.contract.models import (
    PROTOCOL_VERSION,
    ToolRequest,
    ToolResult,
    ToolSpec,
    error_text,
)
from tool_workers.contract.names import task_name
from tool_workers.contract.settings import Settings, ToolPolicies, ToolPolicy
from tool_workers.contract.signing import refused_request_text, request_problem, sign_result
from tool_workers.contract.store import store_for
from tool_workers.observability.metrics import active as active_metrics
from tool_workers.runtime.execute import Limits, TransientToolError, run_call, tool_traceback
from tool_workers.runtime.injection import WorkerGraph, injected_args_of
from tool_workers.runtime.progress import ProgressPublisher, publishing

log = logging.getLogger("toolfleet.worker")

RESULT_REPR_CHARS = 64
"""Characters of a result's repr Celery computes (``status`` is among the first)."""

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


def tool_spec(tool: BaseTool, policy: ToolPolicy) -> ToolSpec:
    """What the registry publishes about ``tool``."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    function = convert_to_openai_tool(tool)["function"]
    return ToolSpec(
        name=tool.name,
        description=function.get("description", tool.description),
        parameters=function.get("parameters", {}),
        return_direct=tool.return_direct,
        queue=policy.queue,
        options={
            "time_limit": policy.time_limit,
            "soft_time_limit": policy.effective_soft_limit,
            "retries": policy.retries,
            "idempotent": policy.idempotent,
            "rate_limit": policy.rate_limit,
            "idle_timeout": policy.idle_timeout,
            "inject_messages": policy.inject_messages,
        },
        injected=injected_args_of(tool),
    )


def register_tools(
    app: Celery,
    tools: list[BaseTool],
    settings: Settings,
    policies: ToolPolicies,
    sources: Mapping[str, str] | None = None,
) -> dict[str, ToolSpec]:
    """Register a ``tools.<name>`` task for each tool; return their specs by name, each
    with its source from ``sources`` (none said if omitted)."""
    specs: dict[str, ToolSpec] = {}
    # A call's marker outlives its last start by the longest a redelivery can take.
    lifetime = int(visibility_timeout(policies, settings.redelivery_margin) + RESTORE_INTERVAL)
    for tool in tools:
        policy = policies.for_tool(tool.name)
        _register(app, tool, settings, policy, lifetime)
        spec = tool_spec(tool, policy)
        if sources and tool.name in sources:
            spec = spec.model_copy(update={"source": sources[tool.name]})
        specs[tool.name] = spec
    return specs


def _is_transient(exc: BaseException, names: tuple[str, ...]) -> bool:
    for cls in type(exc).__mro__:
        if cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names:
            return True
    return False


def _register(
    app: Celery, tool: BaseTool, settings: Settings, policy: ToolPolicy, lifetime: int
) -> None:
    limits = Limits(
        max_arg_bytes=policy.max_arg_bytes or settings.max_arg_bytes,
        max_result_bytes=policy.max_result_bytes or settings.max_result_bytes,
        soft_time_limit=policy.effective_soft_limit,
    )
    transient_names = policy.retry_on if policy.retries else ()
    key_prefix = settings.key_prefix
    needs_store = injected_args_of(tool).store is not None
    signing_key = settings.signing_key
    own_task = task_name(tool.name)

    def seal(task_id: str, body: dict[str, Any]) -> dict[str, Any]:
        # Every result this task returns is signed when the fleet has a key.
        return sign_result(signing_key, task_id, body) if signing_key else body

    @app.task(  # type: ignore[untyped-decorator]
        name=task_name(tool.name),
        bind=True,
        typing=False,
        queue=policy.queue,
        time_limit=policy.time_limit,
        soft_time_limit=policy.effective_soft_limit,
        rate_limit=policy.rate_limit,
        max_retries=policy.retries,
        acks_late=True,
        reject_on_worker_lost=True,
        # Task events (Flower) carry the result's status, not the result.
        Request="tool_workers.celery_ext.redaction:ToolCallRequest",
        # An error result is raised as a failed task (Flower's Failed tab): expected, so
        # Celery logs it in one line, without a traceback, and never retries it.
        throws=(ToolCallFailed,),
        # Celery passes the result's repr from the pool process back for its log line
        # and event, where only the status is shown: its start is enough.
        resultrepr_maxsize=RESULT_REPR_CHARS,
        # This app's task, with this app's policy: not copied into other apps of the
        # process (Celery would give them the first app's options).
        shared=False,
    )
    def run_tool(self: Task, *args: Any, **kwargs: Any) -> dict[str, Any]:
        result = answer(self, *args, **kwargs)
        if result.get("status") == "error":
            # Stored and published as the task's FAILURE, the result riding along
            # (tool_workers.contract.failed): the caller reads it as a success's. The
            # tool's own traceback is its cause: the traceback Flower shows.
            raise failure_of(result) from tool_traceback()
        return result

    def admit(task_id: str, raw: Any, epoch: str, worker: str) -> ToolRequest | dict[str, Any]:
        """The request of a delivery, or the answer (sealed) to one that must not run:
        unsigned or signed wrongly, malformed, naming another tool, or untimely."""
        if signing_key:
            problem = request_problem(signing_key, task_id, own_task, raw, epoch)
            if problem is not None:
                log.error("refused the %s request of call %s", problem, task_id)
                refused = ToolResult.error(
                    "protocol", refused_request_text(tool.name, problem), worker=worker
                )
                return seal(task_id, refused.to_wire())
        request = _decode(raw, tool.name, worker)
        if isinstance(request, ToolResult):
            return seal(task_id, request.to_wire())
        if request.tool != tool.name:
            # The task name routed the call here; a request naming another tool is not
            # run as this one.
            log.error(
                "refused call %s: the task is %s, its request names another tool",
                task_id,
                tool.name,
            )
            mismatch = ToolResult.error(
                "protocol",
                f"Error: the call to '{tool.name}' names another tool in its request "
                f"({request.tool!r}); it was not run.\n Please fix your mistakes.",
                worker=worker,
            )
            return seal(task_id, mismatch.to_wire())
        if signing_key:
            untimely = _untimely(request, tool.name, lifetime, worker)
            if untimely is not None:
                return seal(task_id, untimely.to_wire())
        return request

    def early(context: Any, raw: Any) -> EarlyStart:
        """A delivery the consumer admits and starts in the round trip that records it
        (:class:`~tool_workers.celery_ext.fence.EarlyStart`): with no start when its
        request must not run (its answer is given with no start counted)."""
        worker = context.hostname or ""
        request = admit(context.id, raw, epoch_of(context), worker)
        if not isinstance(request, ToolRequest):
            return EarlyStart(context.id, answer=request)
        since = EPOCHS.generation
        keys, args = _start_of(context, key_prefix, lifetime, worker, request.progress)
        return EarlyStart(context.id, request, None, tuple(keys), tuple(args), since, os.getpid())

    early_starts = app.conf.get("toolfleet_early_starts")
    if early_starts is None:
        early_starts = app.conf.toolfleet_early_starts = {}
    early_starts[own_task] = early

    def answer(self: Task, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The call's result (wire form, sealed): the task body but for how it ends."""
        worker = self.request.hostname or ""
        early = take_early(self.request)
        if early is not None and early.answer is not None:
            return early.answer
        if early is not None and early.start is not None:
            request = early.request
        else:
            early = None
            raw = args[0] if args else kwargs.get("request")
            admitted = admit(self.request.id, raw, epoch_of(self.request), worker)
            if not isinstance(admitted, ToolRequest):
                return admitted
            request = admitted
        attempt = self.request.retries + 1
        refusal = _check_delivery(
            self,
            key_prefix,
            lifetime,
            attempt,
            tool.name,
            policy,
            worker,
            request.progress,
            early,
        )
        if refusal is not None:
            return seal(self.request.id, refusal)

        t0 = time.perf_counter()
        channel = reply_channel_of(self.request)
        publisher = (
            ProgressPublisher(self.backend.client, channel, self.request.id)
            if request.progress and channel
            else None
        )
        graph = WorkerGraph(
            store=store_for(settings) if needs_store else None,
            write=publisher.write if publisher is not None else None,
        )
        try:
            with publishing(publisher):
                result = run_call(
                    tool,
                    request,
                    worker=worker,
                    attempt=attempt,
                    limits=limits,
                    transient=(Exception,) if transient_names else (),
                    graph=graph,
                )
        except TransientToolError as err:
            if _is_transient(err.exc, transient_names) and self.request.retries < policy.retries:
                delay = min(
                    policy.retry_backoff * 2**self.request.retries, policy.retry_backoff_max
                )
                log.warning(
                    "tool %s call %s failed (%r); retry %d/%d in %.1fs",
                    tool.name,
                    request.call_id,
                    err.exc,
                    attempt,
                    policy.retries,
                    delay,
                )
                # The retry's number is trusted up to what a worker noted (fence.py).
                _retry_script(self.backend)(
                    keys=[marker_key(key_prefix, self.request.id)],
                    args=[self.request.retries + 1, lifetime],
                )
                raise self.retry(exc=err.exc, countdown=delay) from err.exc
            result = ToolResult.error(
                "tool_error", error_text(err.exc), worker=worker, duration=time.perf_counter() - t0
            )
        if log.isEnabledFor(logging.INFO):
            log.info(
                "tool call finished",
                extra={
                    "toolfleet": {
                        "side": "worker",
                        "tool": tool.name,
                        "tool_call_id": request.call_id,
                        "thread_id": request.thread_id,
                        "run_id": request.run_id,
                        "task_id": self.request.id,
                        "worker": worker,
                        "attempt": attempt,
                        "duration_ms": round(result.duration * 1000, 3),
                        "outcome": result.error_kind or "success",
                    }
                },
            )
        return seal(self.request.id, result.to_wire())


CLOCK_SKEW = 60.0
"""Seconds the clocks of an orchestrator's and a worker's host may disagree by."""


def _untimely(request: ToolRequest, tool: str, window: float, worker: str) -> ToolResult | None:
    """The answer to a signed request that must not run now: one issued longer ago than the
    redelivery window (a replay: within the window the call's marker knows it ran), or
    with no issue time; one past its run's deadline."""
    now = time.time()
    issued = request.issued_at
    if issued is None or now - issued > window + CLOCK_SKEW or issued - now > CLOCK_SKEW:
        log.error(
            "refused call %s to %s: issued outside the redelivery window", request.call_id, tool
        )
        return ToolResult.error(
            "protocol",
            f"Error: the call to '{tool}' was refused: its signed request was issued "
            f"{'at no stated time' if issued is None else f'{now - issued:.0f} s ago'}, "
            f"outside the {window:.0f} s a call can be redelivered in (a replay). The tool "
            "did not run.",
            worker=worker,
        )
    if request.expires_at is not None and now > request.expires_at + CLOCK_SKEW:
        log.warning(
            "call %s to %s arrived after its run's deadline; not running it", request.call_id, tool
        )
        return ToolResult.error(
            "cancelled",
            f"Error: the call to '{tool}' reached a worker after its run's deadline, and was "
            "not run.",
            worker=worker,
        )
    return None


def _decode(raw: Any, tool: str, worker: str) -> ToolRequest | ToolResult:
    """The request, or an error result the model can read if it is malformed."""
    if isinstance(raw, dict) and raw.get("protocol_version", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        log.error("refused call to %s: protocol version %r", tool, raw.get("protocol_version"))
        return ToolResult.error(
            "protocol",
            f"Error: the call to '{tool}' uses protocol version {raw.get('protocol_version')!r}; "
            f"this worker speaks version {PROTOCOL_VERSION}.\n Please fix your mistakes.",
            worker=worker,
        )
    try:
        return ToolRequest.from_wire(raw)
    except ValidationError as exc:
        # Field locations and messages only: the input may hold secrets.
        problems = exc.errors(include_url=False, include_input=False, include_context=False)
        log.error("refused malformed call to %s: %s", tool, problems)
        return ToolResult.error(
            "protocol",
            f"Error: the call to '{tool}' is malformed: "
            f"{exc.error_count()} error(s): {problems}\n"
            " Please fix your mistakes.",
            worker=worker,
        )


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


def _retry_script(backend: Any) -> Any:
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


def _start_of(
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


def _check_delivery(
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
        keys, args = _start_of(task.request, key_prefix, lifetime, worker, announce)
        start = parse_start(_start_script(task.backend)(keys=keys, args=args))
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
