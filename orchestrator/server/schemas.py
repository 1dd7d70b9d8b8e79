"""Request bodies and response shapes of the Agent Protocol subset toolfleet serves.

Field names and defaults follow what ``langgraph-sdk`` sends and reads. Unknown request
fields are ignored (newer clients send more than this server uses); a field of the wrong
type or value is a 422 that names it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

StreamMode = Literal[
    "values", "updates", "messages-tuple", "custom", "debug", "tasks", "checkpoints"
]
"""Stream modes this server produces (``messages-tuple`` is LangGraph's ``messages``)."""

STREAM_MODES: tuple[str, ...] = StreamMode.__args__  # type: ignore[attr-defined]
DEFAULT_MODES: tuple[StreamMode, ...] = ("values",)

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]
ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
TERMINAL_STATUSES = frozenset({"error", "success", "timeout", "interrupted"})
"""Run statuses after which nothing changes."""


ID_MAX_CHARS = 256
"""Longest thread, run, assistant or checkpoint id accepted."""

_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
"""No control characters: ids go into headers (``Location``) and log lines."""

Id = Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=_PRINTABLE)]
"""A client-given id in a body."""

ThreadId = Annotated[str, Path(min_length=1, max_length=ID_MAX_CHARS, pattern=_PRINTABLE)]
"""A thread id in the path."""

RunId = Annotated[str, Path(min_length=1, max_length=ID_MAX_CHARS, pattern=_PRINTABLE)]
"""A run id in the path."""

ItemId = Annotated[str, Path(min_length=1, max_length=ID_MAX_CHARS, pattern=_PRINTABLE)]
"""An assistant or checkpoint id in the path."""


MAX_DEPTH = 64
"""Deepest nesting of objects and lists accepted in a client's JSON value."""

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
"""Integers JSON encoders and the checkpointers carry (64 bits)."""

MAX_SECONDS = 86_400.0
"""Longest ``after_seconds`` delay of a run: a day."""


def _check_json(value: Any) -> Any:
    """Refuse what the encoders and checkpointers cannot store: nesting deeper than
    :data:`MAX_DEPTH`, integers beyond 64 bits, non-finite floats. The error names the
    path inside the field."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels at {path or '.'}")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{path}.{k}"[:200], depth + 1) for k, v in pairs)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int | float) and not _INT_MIN <= item <= _INT_MAX:
            # Integers and floats alike (NaN fails the comparison): one rule, and one
            # the OpenAPI document can state.
            raise ValueError(f"number beyond the 64-bit range at {path or '.'}")
    return value


JSON_VALUE_REF = "#/components/schemas/JsonValue"
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "title": "JsonValue",
    "description": f"Any JSON value, numbers within 64 bits, nested at most {MAX_DEPTH} deep",
    "anyOf": [
        {"type": "string"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "number", "minimum": _INT_MIN, "maximum": _INT_MAX},
        {"type": "array", "items": {"$ref": JSON_VALUE_REF}},
        {"type": "object", "additionalProperties": {"$ref": JSON_VALUE_REF}},
    ],
}
"""The schema of :data:`JsonValue` in the OpenAPI document (its components)."""

JSON_VALUE_MARK = "x-toolfleet-json-value"
"""Marks where the document refers to :data:`JSON_VALUE_SCHEMA` (pydantic resolves a
``$ref`` it does not know itself: the mark is replaced by one when the document is made)."""

_OBJECT_SCHEMA = {"type": "object", "additionalProperties": {JSON_VALUE_MARK: True}}

JsonObject = Annotated[dict[str, Any], AfterValidator(_check_json), WithJsonSchema(_OBJECT_SCHEMA)]
"""A JSON object from a client, of bounded depth and 64-bit numbers."""

JsonValue = Annotated[Any, AfterValidator(_check_json), WithJsonSchema({JSON_VALUE_MARK: True})]
"""Any JSON value from a client, of bounded depth and 64-bit numbers."""

_FILTER_KEY = r"^[A-Za-z0-9_.-]{1,128}$"


def _check_filter_keys(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # The checkpointers build JSON paths from the keys: only plain names are safe there.
    for key in value or {}:
        if not re.fullmatch(_FILTER_KEY, key):
            raise ValueError(f"filter key {key[:40]!r} is not 1-128 letters, digits, '_', '.', '-'")
    return value


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RunConfig(_Body):
    """The ``config`` of a run: LangGraph's ``RunnableConfig``, primitives only."""

    tags: list[str] = Field(default_factory=list)
    recursion_limit: int | None = Field(default=None, gt=0, le=100_000)
    configurable: JsonObject = Field(default_factory=dict)


class CheckpointRef(_Body):
    """A checkpoint of a thread."""

    thread_id: Id | None = None
    checkpoint_ns: Annotated[str, StringConstraints(max_length=ID_MAX_CHARS)] = ""
    checkpoint_id: Id | None = None
    checkpoint_map: JsonObject | None = None


class RunCommand(_Body):
    """Resume or steer an interrupted thread (LangGraph's ``Command``)."""

    update: JsonObject | Annotated[list[JsonValue], Field(max_length=10_000)] | None = None
    resume: JsonValue = None
    goto: JsonValue = None


class RunCreate(_Body):
    """Body of ``POST /threads/{thread_id}/runs`` (and ``/stream``, ``/wait``, ``/runs``)."""

    assistant_id: Id
    """The assistant id, or its graph id (``"agent"``)."""
    input: JsonObject | None = None
    command: RunCommand | None = None
    config: RunConfig | None = None
    context: JsonObject | None = None
    metadata: JsonObject = Field(default_factory=dict)
    stream_mode: list[StreamMode] = Field(default_factory=lambda: list(DEFAULT_MODES))
    """Stream modes recorded for the run (``custom`` is always recorded too)."""
    stream_subgraphs: bool = False
    stream_resumable: bool = False
    checkpoint: CheckpointRef | None = None
    checkpoint_id: Id | None = None
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    multitask_strategy: Literal["reject", "interrupt", "enqueue"] = "reject"
    """What to do when the thread already has a run: refuse (409), cancel it, or queue."""
    if_not_exists: Literal["reject", "create"] = "reject"
    on_disconnect: Literal["cancel", "continue"] = "continue"
    """For ``/stream`` and ``/wait``: whether a client leaving cancels the run."""
    on_completion: Literal["delete", "keep"] | None = None
    """For runs without a thread: delete (default) or keep the thread made for them."""
    after_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    """Seconds to wait before the run starts (at most a day)."""
    durability: Literal["sync", "async", "exit"] | None = None

    @field_validator("stream_mode", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ThreadCreate(_Body):
    """Body of ``POST /threads``."""

    thread_id: Id | None = None
    metadata: JsonObject = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"


class ThreadSearch(_Body):
    """Body of ``POST /threads/search``."""

    metadata: JsonObject | None = None
    ids: list[Id] | None = Field(default=None, max_length=1000)
    status: ThreadStatus | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=1_000_000)


class HistoryRequest(_Body):
    """Body of ``POST /threads/{thread_id}/history``."""

    limit: int = Field(default=10, ge=1, le=1000)
    before: Id | CheckpointRef | None = None
    """Only checkpoints older than this one: its id, the checkpoint (the Python SDK), or a
    config whose ``configurable`` is the checkpoint (the JS SDK)."""
    metadata: Annotated[
        JsonObject | None,
        AfterValidator(_check_filter_keys),
        WithJsonSchema(
            {
                "anyOf": [
                    {**_OBJECT_SCHEMA, "propertyNames": {"pattern": _FILTER_KEY}},
                    {"type": "null"},
                ]
            }
        ),
    ] = None
    """Checkpoints whose metadata has these values (keys: letters, digits, ``_.-``)."""
    checkpoint: CheckpointRef | None = None

    @field_validator("before", mode="before")
    @classmethod
    def _unwrap_config(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("configurable"), dict):
            return value["configurable"]
        return value


class StateAtCheckpoint(_Body):
    """Body of ``POST /threads/{thread_id}/state/checkpoint``."""

    checkpoint: CheckpointRef
    subgraphs: bool = False


class AssistantSearch(_Body):
    """Body of ``POST /assistants/search``."""

    graph_id: Id | None = None
    name: Id | None = None
    metadata: JsonObject | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=1_000_000)


# -- responses --------------------------------------------------------------------------


class Assistant(BaseModel):
    """An assistant: one per agent this server runs."""

    assistant_id: str
    graph_id: str
    config: dict[str, Any]
    context: dict[str, Any]
    metadata: dict[str, Any]
    name: str
    description: str | None
    version: int
    created_at: str
    updated_at: str


class Thread(BaseModel):
    """A conversation: its checkpoints live in the LangGraph checkpointer."""

    thread_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any]
    status: ThreadStatus
    values: Any = None
    interrupts: dict[str, Any] = Field(default_factory=dict)


class Run(BaseModel):
    """One invocation of the agent on a thread."""

    run_id: str
    thread_id: str
    assistant_id: str
    created_at: str
    updated_at: str
    status: RunStatus
    metadata: dict[str, Any]
    multitask_strategy: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    replica: str | None = None
    """The orchestrator replica executing the run (toolfleet extension)."""
    error: dict[str, Any] | None = None
    """``{"error": type, "message": text}`` of a failed run (toolfleet extension)."""


class ThreadState(BaseModel):
    """A checkpoint of a thread: its values and what runs next."""

    values: Any
    next: list[str]
    checkpoint: dict[str, Any] | None
    metadata: dict[str, Any] | None
    created_at: str | None
    parent_checkpoint: dict[str, Any] | None
    tasks: list[dict[str, Any]]
    interrupts: list[Any]
