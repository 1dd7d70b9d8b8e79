"""Request bodies of the Agent Protocol subset toolfleet serves, and their limits (the
responses are :mod:`orchestrator.server.responses`).

Field names and defaults follow what ``langgraph-sdk`` sends and reads. A field this
server does not know is a 422 that names it, as is a field of the wrong type or value: a
request is carried out as sent, or refused, never carried out in part. The one open
object is a run's ``config`` (:class:`RunConfig`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import orjson
from fastapi import Path, Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from orchestrator.jsonvalue import INT_MAX as _INT_MAX
from orchestrator.jsonvalue import INT_MIN as _INT_MIN
from orchestrator.jsonvalue import MAX_DEPTH as MAX_DEPTH
from orchestrator.jsonvalue import check_json as _check_json
from orchestrator.jsonvalue import surrogate_at as _surrogate_at

StreamMode = Literal[
    "values",
    "updates",
    "messages-tuple",
    "messages",
    "custom",
    "debug",
    "tasks",
    "checkpoints",
    "events",
]
"""Stream modes this server produces (``messages-tuple`` is LangGraph's ``messages``;
``messages`` the older form of token streaming; ``events`` the callback events)."""

STREAM_MODES: tuple[str, ...] = StreamMode.__args__  # type: ignore[attr-defined]
DEFAULT_MODES: tuple[StreamMode, ...] = ("values",)

MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]
CancelAction = Literal["interrupt", "rollback"]
"""``interrupt`` stops a run; ``rollback`` stops it and deletes it and its checkpoints."""

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]
ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
TERMINAL_STATUSES = frozenset({"error", "success", "timeout", "interrupted"})
"""Run statuses after which nothing changes."""


ID_MAX_CHARS = 256
"""Longest thread, run, assistant or checkpoint id accepted."""

PAGE_MAX = 1000
"""The most records one page of a list or a search holds."""

OFFSET_MAX = 1_000_000
"""The furthest offset a list or a search starts at."""

PageLimit = Annotated[int, Field(ge=1, le=PAGE_MAX)]
"""A page's size in a request body."""

PageOffset = Annotated[int, Field(ge=0, le=OFFSET_MAX)]
"""A page's offset in a request body."""

LimitQuery = Annotated[int, Query(ge=1, le=PAGE_MAX)]
"""A page's size in a query string."""

OffsetQuery = Annotated[int, Query(ge=0, le=OFFSET_MAX)]
"""A page's offset in a query string."""

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


def _one_segment(value: str) -> str:
    """Refuse an id that cannot come back as one URL path segment: the server decodes
    ``%2F`` before routing (so an id with ``/`` could never be read or deleted), and
    clients collapse a ``.`` or ``..`` segment before sending it."""
    if "/" in value:
        raise ValueError("an id may not contain '/' (it must fit in one URL path segment)")
    if value in (".", ".."):
        raise ValueError(f"{value!r} is not an id (clients drop it from a URL path)")
    return value


NewId = Annotated[Id, AfterValidator(_one_segment)]
"""A client-given id of a thread or assistant it creates: also one URL path segment."""

NewThreadId = Annotated[ThreadId, AfterValidator(_one_segment)]
"""A thread id in the path of a request that may create the thread."""


MAX_SECONDS = 86_400.0
"""Longest ``after_seconds`` delay of a run: a day."""


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

_FILTER_MIN, _FILTER_MAX = -(2**63), 2**63 - 1
"""Integers a checkpointer compares in a filter: SQLite's, signed 64 bits."""


def _check_filter_keys(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # The checkpointers build JSON paths from the keys: only plain names are safe there.
    for key in value or {}:
        if not re.fullmatch(_FILTER_KEY, key):
            raise ValueError(f"filter key {key[:40]!r} is not 1-128 letters, digits, '_', '.', '-'")
    # And bind the values as SQL parameters: an integer SQLite cannot hold overflows.
    stack: list[tuple[Any, str]] = [(v, k) for k, v in (value or {}).items()]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict | list):
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{path}.{k}"[:200]) for k, v in pairs)
        elif (
            isinstance(item, int)
            and not isinstance(item, bool)
            and not (_FILTER_MIN <= item <= _FILTER_MAX)
        ):
            raise ValueError(f"filter value at {path} is beyond the signed 64-bit integers")
    return value


def decimal(text: Any, most: int) -> int | None:
    """``text`` read as a count a client sends back or names (a page token, a header, a
    query flag): ASCII digits only, ``0`` to ``most``; ``None`` for anything else (other
    Unicode digits, which ``str.isdigit`` accepts and ``int`` may refuse, signs, spaces,
    more digits than ``most`` has, a value past it, or not a string at all)."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        return None
    if len(text) > len(str(most)):
        return None
    value = int(text)
    return value if value <= most else None


class RequestBody(BaseModel):
    """A request body: only its documented fields (another is a 422 naming it), each of
    its documented JSON type, and every string of it encodable.

    Types are strict: ``false`` is not the integer 0, ``"5"`` is not 5 and ``1`` is not
    ``true``, so a value the document refuses is a 422 here too, never a guess.

    JSON may spell a lone surrogate (``"\\ud800"``), which Python parses into a string
    that nothing downstream can encode: such a body is a 422 naming where it is, before
    anything is stored.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _encodable(cls, data: Any) -> Any:
        try:
            orjson.dumps(data)  # fast, in C; it fails on surrogates (and on other things)
        except (TypeError, ValueError):
            where = _surrogate_at(data)
            if where is not None:
                raise ValueError(
                    f"string at {where} holds a lone surrogate (not encodable as UTF-8)"
                ) from None
        return data


WebhookUrl = Annotated[
    str, StringConstraints(min_length=8, max_length=4096, pattern=r"^[Hh][Tt][Tt][Pp][Ss]?://\S+$")
]
"""An http(s) URL a run's outcome is POSTed to (its host is checked when the run is made)."""


class RunConfig(RequestBody):
    """The ``config`` of a run: LangGraph's ``RunnableConfig``, primitives only.

    The one body that keeps other keys out without refusing them: a ``RunnableConfig``
    is open (``RemoteGraph`` sends its ``metadata``, an assistant's stored config may
    hold ``run_name`` or ``max_concurrency``), and LangGraph's server takes it open too.
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    tags: list[str] = Field(default_factory=list)
    recursion_limit: int | None = Field(default=None, gt=0, le=100_000)
    configurable: JsonObject = Field(default_factory=dict)


class CheckpointRef(RequestBody):
    """A checkpoint of a thread."""

    thread_id: Id | None = None
    checkpoint_ns: Annotated[str, StringConstraints(max_length=ID_MAX_CHARS)] = ""
    checkpoint_id: Id | None = None
    checkpoint_map: JsonObject | None = None


class RunCommand(RequestBody):
    """Resume or steer an interrupted thread (LangGraph's ``Command``)."""

    update: JsonObject | Annotated[list[JsonValue], Field(max_length=10_000)] | None = None
    resume: JsonValue = None
    goto: JsonValue = None


_NO_FEEDBACK = (
    "feedback URLs are LangSmith's and this server has no LangSmith (/info: langsmith "
    "false); leave out feedback_keys"
)


def _no_feedback_keys(value: Any) -> None:
    if value:
        raise ValueError(_NO_FEEDBACK)


FeedbackKeys = Annotated[
    Any,
    BeforeValidator(_no_feedback_keys),
    WithJsonSchema({"type": "null", "description": _NO_FEEDBACK}),
]
"""``feedback_keys`` of a run: refused (422 naming it) unless null or empty."""


class RunCreate(RequestBody):
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
    multitask_strategy: MultitaskStrategy = "enqueue"
    """What to do when the thread already has a run: queue this one after it (LangGraph's
    default), refuse (409), cancel it (``interrupt``), or cancel it and delete it with the
    checkpoints it wrote (``rollback``)."""
    if_not_exists: Literal["reject", "create"] = "reject"
    on_disconnect: Literal["cancel", "continue"] = "continue"
    """For ``/stream`` and ``/wait``: whether a client leaving cancels the run."""
    on_completion: Literal["delete", "keep"] | None = None
    """For runs without a thread: delete (default) or keep the thread made for them."""
    after_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    """Seconds to wait before the run starts (at most a day)."""
    durability: Literal["sync", "async", "exit"] | None = None
    checkpoint_during: bool | None = None
    """The older form of ``durability`` (used only without it): ``true`` is ``async``,
    ``false`` is ``exit``, as on LangGraph's server."""
    webhook: WebhookUrl | None = None
    """URL the finished run is POSTed to (:mod:`orchestrator.server.webhooks`)."""
    feedback_keys: FeedbackKeys = None

    @field_validator("stream_mode", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _checkpoint_during(self) -> RunCreate:
        if self.durability is None and self.checkpoint_during is not None:
            self.durability = "async" if self.checkpoint_during else "exit"
        return self

    @model_validator(mode="after")
    def _empty_input_beside_command(self) -> RunCreate:
        # Agent Chat UI resumes with {"input": {}, "command": ...}; LangGraph's server
        # reads the empty input as none. One with content beside a command stays a 422.
        if self.command is not None and self.input == {}:
            self.input = None
        return self


class StateUpdate(RequestBody):
    """One update of a superstep: values written as node ``as_node``, or a command."""

    values: JsonObject | Annotated[list[JsonValue], Field(max_length=10_000)] | None = None
    command: RunCommand | None = None
    as_node: Id | None = None


class Superstep(RequestBody):
    """The updates of one superstep, applied together (one checkpoint)."""

    updates: Annotated[list[StateUpdate], Field(min_length=1, max_length=1000)]


_NO_THREAD_TTL = (
    "threads expire TOOLFLEET_THREAD_TTL after their last change; a TTL per thread is not "
    "supported (leave out ttl)"
)


def _no_thread_ttl(value: Any) -> None:
    if value is not None:
        raise ValueError(_NO_THREAD_TTL)


ThreadTtl = Annotated[
    Any,
    BeforeValidator(_no_thread_ttl),
    WithJsonSchema({"type": "null", "description": _NO_THREAD_TTL}),
]
"""``ttl`` of a thread: refused (422 naming it) unless null."""


class ThreadCreate(RequestBody):
    """Body of ``POST /threads``."""

    thread_id: NewId | None = None
    metadata: JsonObject = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"
    supersteps: Annotated[list[Superstep], Field(min_length=1, max_length=1000)] | None = None
    """The thread's history to write at once, a checkpoint per superstep, by the graph
    its metadata's ``graph_id`` names."""
    ttl: ThreadTtl = None


SortOrder = Literal["asc", "desc"]
ThreadSortBy = Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"]
AssistantSortBy = Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"]


ThreadField = Literal[
    "thread_id",
    "created_at",
    "updated_at",
    "state_updated_at",
    "metadata",
    "config",
    "status",
    "values",
    "interrupts",
]
AssistantField = Literal[
    "assistant_id",
    "graph_id",
    "name",
    "description",
    "config",
    "context",
    "created_at",
    "updated_at",
    "metadata",
    "version",
]
RunField = Literal[
    "run_id",
    "thread_id",
    "assistant_id",
    "created_at",
    "updated_at",
    "status",
    "metadata",
    "kwargs",
    "multitask_strategy",
]
"""The fields a search may ``select``, as LangGraph's server names them."""

EXTRACT_ROOTS = ("values", "metadata", "config", "interrupts")
"""The fields of a thread an ``extract`` path may start from."""

_ALIAS = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_PATH = r"^(values|metadata|config|interrupts)([.\[].*)?$"


def _check_aliases(value: dict[str, str]) -> dict[str, str]:
    for alias in value:
        if alias in ThreadField.__args__:  # type: ignore[attr-defined]
            raise ValueError(f"extract alias {alias!r} is a field of a thread")
    return value


Extract = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=_ALIAS)],
        Annotated[str, StringConstraints(max_length=512, pattern=_PATH)],
    ],
    Field(max_length=10),
    AfterValidator(_check_aliases),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 10,
            "propertyNames": {
                "pattern": _ALIAS,
                "not": {"enum": list(ThreadField.__args__)},
            },
            "additionalProperties": {"type": "string", "maxLength": 512, "pattern": _PATH},
        }
    ),
]
"""``alias: path`` pairs (at most 10), each path starting at a field of
:data:`EXTRACT_ROOTS`; an alias is an identifier, not a field of a thread."""


class ThreadSearch(RequestBody):
    """Body of ``POST /threads/search``."""

    metadata: JsonObject | None = None
    ids: list[Id] | None = Field(default=None, max_length=1000)
    status: ThreadStatus | None = None
    limit: PageLimit = 10
    offset: PageOffset = 0
    sort_by: ThreadSortBy | None = None
    """Default: ``updated_at``, most recent first."""
    sort_order: SortOrder | None = None
    """Default: ``desc``."""
    values: JsonObject | None = None
    """Threads whose latest values contain these."""
    select: list[ThreadField] | None = None
    """Only these fields of each thread."""
    extract: Extract | None = None
    """Values picked out of each thread (``alias: "values.messages[-1].content"``), in
    its ``extracted`` field."""


class ThreadPrune(RequestBody):
    """Body of ``POST /threads/prune``."""

    thread_ids: Annotated[list[Id], Field(max_length=1000)]
    """The threads to delete (ids of no thread of the tenant's are left out of the count)."""
    strategy: Literal["delete"] = "delete"
    """``delete`` removes each thread. LangGraph's ``keep_latest`` (keep only the latest
    checkpoint) is a 422 here, as on its in-memory server."""


class HistoryRequest(RequestBody):
    """Body of ``POST /threads/{thread_id}/history``."""

    limit: PageLimit = 10
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


class ThreadPatch(RequestBody):
    """Body of ``PATCH /threads/{thread_id}``."""

    metadata: JsonObject = Field(default_factory=dict)
    """Merged into the thread's metadata (these keys win)."""
    ttl: ThreadTtl = None


class ThreadCount(RequestBody):
    """Body of ``POST /threads/count``."""

    metadata: JsonObject | None = None
    status: ThreadStatus | None = None
    values: JsonObject | None = None
    """Threads whose latest values contain these."""


class ThreadStateUpdate(RequestBody):
    """Body of ``POST /threads/{thread_id}/state``: a human edit of the thread's state."""

    values: JsonObject | Annotated[list[JsonValue], Field(max_length=10_000)] | None = None
    """The update, applied as the node ``as_node`` had returned it."""
    as_node: Id | None = None
    checkpoint: CheckpointRef | None = None
    """The checkpoint to fork from (default: the latest)."""
    checkpoint_id: Id | None = None


class StateAtCheckpoint(RequestBody):
    """Body of ``POST /threads/{thread_id}/state/checkpoint``."""

    checkpoint: CheckpointRef
    subgraphs: bool = False


class AssistantCount(RequestBody):
    """Body of ``POST /assistants/count``."""

    graph_id: Id | None = None
    name: Id | None = None
    metadata: JsonObject | None = None


class AssistantSearch(AssistantCount):
    """Body of ``POST /assistants/search``."""

    limit: PageLimit = 10
    offset: PageOffset = 0
    sort_by: AssistantSortBy | None = None
    """Default: ``created_at``, newest first; names and graph ids ignore case."""
    sort_order: SortOrder | None = None
    """Default: ``desc``."""
    select: list[AssistantField] | None = None
    """Only these fields of each assistant."""


class AssistantCreate(RequestBody):
    """Body of ``POST /assistants``: a graph of this server with a config of its own."""

    graph_id: Id
    assistant_id: NewId | None = None
    """Default: a new UUID."""
    config: JsonObject | None = None
    context: JsonObject | None = None
    metadata: JsonObject | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    name: Annotated[str, StringConstraints(max_length=ID_MAX_CHARS)] | None = None
    """Default: ``Untitled``."""
    description: Annotated[str, StringConstraints(max_length=10_000)] | None = None


class AssistantPatch(RequestBody):
    """Body of ``PATCH /assistants/{assistant_id}``: what the new version changes."""

    graph_id: Id | None = None
    config: JsonObject | None = None
    context: JsonObject | None = None
    metadata: JsonObject | None = None
    """Merged into the assistant's."""
    name: Annotated[str, StringConstraints(max_length=ID_MAX_CHARS)] | None = None
    description: Annotated[str, StringConstraints(max_length=10_000)] | None = None


class AssistantVersionsSearch(RequestBody):
    """Body of ``POST /assistants/{assistant_id}/versions``."""

    metadata: JsonObject | None = None
    limit: PageLimit = 10
    offset: PageOffset = 0


class AssistantLatest(RequestBody):
    """Body of ``POST /assistants/{assistant_id}/latest``."""

    version: int = Field(ge=1, le=1_000_000_000)
