"""The wire contract between the orchestrator and the tool workers.

Both sides import this module and nothing else of each other. A tool call crosses
the wire as one Celery task named ``tools.<tool name>`` whose single argument is a
:class:`ToolRequest` (JSON); the task returns a :class:`ToolResult` (JSON). The
orchestrator builds the ToolMessage itself, with the model's own ``tool_call_id``.

Task ids are derived from the call's identity (thread, AIMessage, tool_call_id), so
dispatching the same call twice attaches to the first dispatch instead of running
the tool twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from tool_workers.contract.names import DEFAULT_QUEUE

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change to ToolRequest or ToolResult.

An optional field added to a version later (``ToolRequest.trace``) does not bump it: the
sender leaves every unset field off the wire (:meth:`ToolRequest.to_wire`), so a worker
of the same version built before the field keeps accepting every request that does not
use it. Such a worker refuses a request that does use it (its models
forbid unknown fields), so the workers are upgraded before the orchestrators start
setting the field (for ``trace``: before tracing is turned on for the orchestrators).
"""

LATER_REQUEST_FIELDS = frozenset({"trace"})
"""ToolRequest fields added after protocol version 1 was first released: off the wire
while unset."""

MAX_ID_CHARS = 256
"""Longest tool name, call id, thread id, run id or idempotency key a worker accepts.

Ids end up in log lines, Flower and Redis keys; a caller's 40,000-character thread id
once held a pool slot for seconds while its log line was masked.
"""

_FROM_WIRE = "toolfleet_from_wire"

ErrorKind = Literal[
    "tool_error",  # the tool raised
    "invalid_args",  # arguments failed the tool's schema
    "unknown_tool",  # no worker serves the tool
    "timeout",  # soft or hard time limit
    "redelivered",  # a non-idempotent call came back after a crash
    "too_large",  # arguments or result over the byte limit
    "bad_result",  # the tool returned something that is not JSON
    "protocol",  # malformed request or unknown protocol version
    "cancelled",  # revoked before it finished
    "worker_lost",  # the worker died and the call could not be rerun
    "unserved",  # no worker consumed the call's queue in time
    "context",  # the tool needs graph context (a store, a state field) it did not get
    "hung",  # no progress within the tool's idle timeout
]


class ToolRequest(BaseModel):
    """One tool call as a worker receives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol_version: int = PROTOCOL_VERSION
    tool: str
    """Name of the tool to run."""
    call_id: str
    """The model's ``tool_call_id``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments as the model produced them."""
    idempotency_key: str
    """Stable across redeliveries and orchestrator restarts; tools may key side effects on it."""
    thread_id: str | None = None
    run_id: str | None = None
    injected: Injected | None = None
    """Graph context the tool declared it needs (state fields, runtime), as JSON."""
    progress: bool = False
    """Publish the tool's stream-writer events (and heartbeats) on the reply channel."""
    trace: TraceContext | None = None
    """The caller's trace context: the worker's span of the call is its child."""
    issued_at: float | None = None
    """When the orchestrator published it (Unix time; signed requests only): a signed
    request older than the redelivery window is a replay and is refused."""
    expires_at: float | None = None
    """The run's deadline (Unix time; signed requests only): a worker that gets the call
    later does not run it. Celery's ``expires`` header, which the signature does not
    cover, is ignored then."""
    signature: str | None = None
    """HMAC-SHA256 of the request and its identity (see :mod:`tool_workers.contract.signing`)."""

    @field_validator("trace", mode="wrap")
    @classmethod
    def _ignore_bad_trace(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Tracing never fails a call: a malformed trace context is dropped.
        try:
            return handler(value)
        except ValidationError:
            return None

    def to_wire(self) -> dict[str, Any]:
        """The request as JSON for the wire, its unset fields left out (every field that
        can be ``None`` defaults to it)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_wire(cls, raw: Any) -> ToolRequest:
        """The request a worker received, with the wire's limits on its ids.

        Raises:
            pydantic.ValidationError: ``raw`` is not a request, or an id is longer than
                :data:`MAX_ID_CHARS`.
        """
        return cls.model_validate(raw, context={_FROM_WIRE: True})

    @field_validator("tool", "call_id", "idempotency_key", "thread_id", "run_id")
    @classmethod
    def _short_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Only on the worker's side: a sender's own long id is refused by the worker as an
        # error result the model reads, not raised where the call is built.
        from_wire = bool(info.context and info.context.get(_FROM_WIRE))
        if from_wire and value is not None and len(value) > MAX_ID_CHARS:
            raise ValueError(f"longer than {MAX_ID_CHARS} characters ({len(value)})")
        return value


TRACE_HEADERS = ("langsmith-trace", "baggage", "traceparent", "tracestate")
"""Propagation headers a call carries: LangSmith's own (``langsmith-trace`` with its
``baggage``) and W3C Trace Context (``traceparent``, ``tracestate``; ``baggage`` is
shared with W3C Baggage)."""


class TraceContext(BaseModel):
    """Trace propagation headers of the orchestrator's side of one call, as sent.

    Each field holds one header's value, unparsed; each is optional, so a caller with
    only LangSmith or only OpenTelemetry sends just its own. Lengths are bounded (the
    values come from another process); ``traceparent`` must have the W3C form.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    langsmith_trace: str | None = Field(default=None, max_length=1024)
    """LangSmith's ``langsmith-trace`` header: the dotted order of the parent run."""
    baggage: str | None = Field(default=None, max_length=8192)
    """The ``baggage`` header (LangSmith's metadata, tags and project, and W3C Baggage)."""
    traceparent: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
    )
    """W3C ``traceparent``: version, trace id, parent span id, flags."""
    tracestate: str | None = Field(default=None, max_length=512)
    """W3C ``tracestate``: vendor entries that travel with ``traceparent``."""

    def headers(self) -> dict[str, str]:
        """The headers that are set, under their wire names (``langsmith-trace``, ...)."""
        values = (self.langsmith_trace, self.baggage, self.traceparent, self.tracestate)
        return {name: value for name, value in zip(TRACE_HEADERS, values, strict=True) if value}

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> TraceContext | None:
        """The context in ``headers`` (case-insensitive names), ``None`` if none is there.

        Raises:
            pydantic.ValidationError: a header value is malformed or too long.
        """
        lowered = {name.lower(): value for name, value in headers.items()}
        found = {name: lowered[name] for name in TRACE_HEADERS if lowered.get(name)}
        if not found:
            return None
        return cls(**{name.replace("-", "_"): value for name, value in found.items()})


class Injected(BaseModel):
    """What the orchestrator sends for a tool's injected arguments (JSON, see wire_json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: dict[str, Any] = Field(default_factory=dict)
    """The state fields the tool declared (``InjectedState``/``ToolRuntime``), by field."""
    context: Any = None
    """The run's ``context`` (for ``ToolRuntime.context``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """A whitelist of the run's config: thread id, run id, tags, metadata."""


class ToolResult(BaseModel):
    """What a worker returns for one call: content, artifact and status, never the message."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol_version: int = PROTOCOL_VERSION
    status: Literal["success", "error"] = "success"
    content: str | list[Any] = ""
    """ToolMessage content: a string or a list of content blocks."""
    artifact: Any = None
    """The tool's artifact (``response_format="content_and_artifact"``), JSON only."""
    command: dict[str, Any] | None = None
    """A ``Command`` the tool returned (``update``, ``goto``), as JSON (see wire_json)."""
    error_kind: ErrorKind | None = None
    worker: str = ""
    """Celery node name of the worker that ran the call."""
    pid: int = 0
    """Process id that ran the call."""
    started_at: float = 0.0
    """Unix time the tool started."""
    duration: float = 0.0
    """Seconds the tool ran."""
    signature: str | None = None
    """HMAC-SHA256 of the result and its task id (see :mod:`tool_workers.contract.signing`)."""

    @classmethod
    def error(cls, kind: ErrorKind, message: str, **fields: Any) -> ToolResult:
        """An error result the model can act on."""
        return cls(status="error", error_kind=kind, content=message, **fields)

    def to_wire(self) -> dict[str, Any]:
        """The result as JSON for the wire: unset fields left out (each defaults to
        ``None``), times to the microsecond."""
        wire = self.model_dump(mode="json", exclude_none=True)
        wire["started_at"] = round(self.started_at, 6)
        wire["duration"] = round(self.duration, 6)
        return wire


def progress_message(task_id: str, seq: int, events: list[Any]) -> dict[str, Any]:
    """A batch of a running call's progress events, as published on the reply channel."""
    return {"task_id": task_id, "progress": events, "seq": seq}


HEARTBEAT = {"__toolfleet_heartbeat__": True}
"""The progress event a heartbeat sends (the orchestrator counts it as life, shows nothing)."""


# -- texts of error results either side writes -------------------------------------------


def error_text(exc: BaseException) -> str:
    """The message ToolNode gives the model when a tool raises."""
    # Imported here: langgraph's prebuilt package costs a second of CPU to import, and
    # light processes (the workers' healthcheck) read this contract without running tools.
    from langgraph.prebuilt.tool_node import TOOL_CALL_ERROR_TEMPLATE

    return TOOL_CALL_ERROR_TEMPLATE.format(error=repr(exc))


def timeout_text(tool: str, limit: float | None) -> str:
    """The message for a call stopped by its time limit, naming the limit."""
    what = f"its time limit of {limit:g} s" if limit else "its time limit"
    return (
        f"Error: the tool '{tool}' did not finish within {what} and was stopped.\n"
        " Please fix your mistakes."
    )


# -- Redis keys and channels: every name toolfleet's core uses is built here --------------


def schema_version(parameters: Mapping[str, Any]) -> str:
    """The version of a tool's argument schema: the first 10 hex digits of the SHA-256 of
    its canonical JSON. Two workers serving a tool at one version take the same arguments."""
    canonical = json.dumps(parameters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


class ToolSpec(BaseModel):
    """What a worker publishes about one tool it serves (enough to bind and call it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """JSON schema of the arguments the model fills in (injected arguments left out)."""
    version: str = ""
    """The schema's version (:func:`schema_version` of ``parameters``): worked out from
    the parameters wherever a spec is read, whatever a worker wrote here."""
    return_direct: bool = False
    queue: str = DEFAULT_QUEUE
    options: dict[str, Any] = Field(default_factory=dict)
    """Policy the tool runs under: time limits, retries, idempotent, rate limit."""
    injected: InjectedArgs = Field(default_factory=lambda: InjectedArgs())
    """The graph context the tool's arguments ask for (hidden from the model)."""
    source: str = ""
    """The kind of worker offering the tool: ``module`` or ``mcp:<server>``
    (:mod:`tool_workers.contract.toolnames`); empty from a worker that does not say."""

    @model_validator(mode="before")
    @classmethod
    def _versioned(cls, data: Any) -> Any:
        if isinstance(data, dict):
            parameters = data.get("parameters")
            version = schema_version(parameters if isinstance(parameters, Mapping) else {})
            return {**data, "version": version}
        return data


class InjectedArgs(BaseModel):
    """Which of a tool's arguments LangGraph injects, and from what."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    state: dict[str, str | None] = Field(default_factory=dict)
    """``InjectedState`` arguments: argument name -> state field (``None``: the state)."""
    store: str | None = None
    """The ``InjectedStore`` argument."""
    runtime: str | None = None
    """The ``ToolRuntime`` argument."""

    @property
    def any(self) -> bool:
        """Whether the tool needs anything from the graph."""
        return bool(self.state or self.store or self.runtime)


class WorkerEntry(BaseModel):
    """One worker's registry entry, refreshed on an interval and expiring without it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    protocol_version: int = PROTOCOL_VERSION
    worker: str
    pid: int
    queues: list[str]
    tools: list[ToolSpec]
    updated_at: float
    sandbox_isolation: str | None = None
    """The isolation between the ``run_python`` calls of a worker serving it: ``namespaces``,
    ``uid`` or ``none``, followed by `` (refusing calls)`` when below the worker's
    ``TOOLFLEET_SANDBOX_MIN_ISOLATION``; ``None`` when it does not serve ``run_python``
    (or published no isolation: an older worker)."""


def span_attributes(values: dict[str, Any]) -> dict[str, str | int]:
    """OpenTelemetry attributes as both sides' spans of a call carry them: strings and
    ints only, the unset ones left out."""
    return {
        key: value if isinstance(value, int) else str(value)
        for key, value in values.items()
        if value is not None and value != ""
    }


# Its field types are defined after it: built here, at import, rather than by the first
# validation, which two threads of a worker's threads pool may run at once (pydantic
# 2.11.0 fails one of them).
ToolRequest.model_rebuild()
