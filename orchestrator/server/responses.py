"""Response shapes of the Agent Protocol subset toolfleet serves, as ``langgraph-sdk``
reads them (the request bodies are :mod:`orchestrator.server.schemas`)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, Field, create_model

from orchestrator.server.schemas import RunStatus, ThreadStatus


class AssistantVersion(BaseModel):
    """One version of an assistant."""

    assistant_id: str
    graph_id: str
    config: dict[str, Any]
    context: dict[str, Any]
    metadata: dict[str, Any]
    name: str
    description: str | None
    version: int
    created_at: str


class Assistant(AssistantVersion):
    """An assistant: a graph this server runs, with its config (one per graph is the
    server's own; tenants create more): its current version, and when it last changed."""

    updated_at: str


class Thread(BaseModel):
    """A conversation: its checkpoints live in the LangGraph checkpointer."""

    thread_id: str
    created_at: str
    updated_at: str
    state_updated_at: str
    """When the thread's state (status, values) last changed."""
    metadata: dict[str, Any]
    status: ThreadStatus
    config: dict[str, Any] = Field(default_factory=dict)
    """The config of the thread's runs, merged run by run."""
    values: Any = None
    interrupts: dict[str, Any] = Field(default_factory=dict)


class StoragePart(BaseModel):
    """How many of a kind of record a thread's checkpoints hold, and their bytes."""

    count: int
    bytes: int


class ChannelStorage(BaseModel):
    """One channel's stored versions and their bytes."""

    versions: int
    bytes: int


class ChannelValuesStorage(StoragePart):
    """The channel values of a thread's checkpoints, each version once."""

    by_channel: dict[str, ChannelStorage]


class ThreadStorage(BaseModel):
    """``GET /threads/{id}/storage``: the bytes a thread's checkpoints occupy."""

    thread_id: str
    total_bytes: int
    checkpoints: StoragePart
    channel_values: ChannelValuesStorage
    pending_writes: StoragePart


class PruneResult(BaseModel):
    """``POST /threads/prune``: how many of the threads named were deleted."""

    pruned_count: int


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
    """The checkpoint (``null`` for a thread without any yet)."""
    metadata: dict[str, Any] | None
    created_at: str | None
    parent_checkpoint: dict[str, Any] | None
    tasks: list[dict[str, Any]]
    interrupts: list[Any]
    checkpoint_id: str | None = None
    """The checkpoint's id (deprecated in LangGraph's protocol, still sent)."""
    parent_checkpoint_id: str | None = None
    """The parent checkpoint's id (likewise)."""


class ThreadUpdated(BaseModel):
    """What ``POST /threads/{thread_id}/state`` answers: the new checkpoint."""

    checkpoint: dict[str, Any]
    configurable: dict[str, Any]
    """The same as ``checkpoint`` (older clients read this)."""
    checkpoint_id: str


def selected(model: type[BaseModel]) -> type[BaseModel]:
    """``model`` as a search answers it with ``select``: only the fields asked for, so
    none of them is required (the document must not promise the others)."""
    fields: dict[str, Any] = {
        name: (Optional[field.annotation], None)  # noqa: UP045 (a runtime type)
        for name, field in model.model_fields.items()
    }
    return create_model(f"Selected{model.__name__}", __doc__=model.__doc__, **fields)


SELECTED_THREADS: Any = list[selected(Thread)]  # type: ignore[misc]
"""What ``POST /threads/search`` answers."""
SELECTED_ASSISTANTS: Any = list[selected(Assistant)]  # type: ignore[misc]
"""What ``POST /assistants/search`` answers."""
