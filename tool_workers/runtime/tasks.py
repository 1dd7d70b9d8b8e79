"""One Celery task per tool, named ``tools.<tool name>``.

The task body decodes the request, asks whether this delivery may run
(:mod:`tool_workers.runtime.delivery`: a call that comes back after its worker died is a
redelivery, and non-idempotent tools are not run again), runs the tool, and retries
transient failures through Celery so every attempt shows in Flower. A call that ends in
an error result ends as a failed task carrying that result
(:mod:`tool_workers.contract.failed`): Flower lists it under Failed, and the
orchestrator reads the result as it reads a success's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task
from langchain_core.tools import BaseTool
from pydantic import ValidationError

from tool_workers.celery_ext.backend import reply_channel_of
from tool_workers.celery_ext.fence import EarlyStart, take_early
from tool_workers.celery_ext.redaction import ToolTaskResult, short_result_repr
from tool_workers.contract.broker import RESTORE_INTERVAL, visibility_timeout
from tool_workers.contract.epoch import epoch_of
from tool_workers.contract.failed import ToolCallFailed, failure_of
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
from tool_workers.runtime.delivery import EPOCHS, check_delivery, retry_script, start_of
from tool_workers.runtime.execute import Limits, TransientToolError, run_call, tool_traceback
from tool_workers.runtime.injection import WorkerGraph, injected_args_of
from tool_workers.runtime.progress import ProgressPublisher, publishing

log = logging.getLogger("toolfleet.worker")

RESULT_REPR_CHARS = 64
"""Characters of a result's repr Celery computes (``status`` is among the first)."""


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
    short_result_repr()
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
        # and event, where only the status is shown (a ToolTaskResult's repr is its
        # status alone; should that ever not hold, its start is enough).
        resultrepr_maxsize=RESULT_REPR_CHARS,
        # This app's task, with this app's policy: not copied into other apps of the
        # process (Celery would give them the first app's options).
        shared=False,
    )
    def run_tool(self: Task, *args: Any, **kwargs: Any) -> ToolTaskResult:
        result = answer(self, *args, **kwargs)
        if result.get("status") == "error":
            # Stored and published as the task's FAILURE, the result riding along
            # (tool_workers.contract.failed): the caller reads it as a success's. The
            # tool's own traceback is its cause: the traceback Flower shows.
            raise failure_of(result) from tool_traceback()
        return ToolTaskResult(result)

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
        keys, args = start_of(context, key_prefix, lifetime, worker, request.progress)
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
        refusal = check_delivery(
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
                retry_script(self.backend)(
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
