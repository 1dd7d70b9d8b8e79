"""The LangGraph configs of a run and of reading a thread."""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.fairshare import TENANT_KEY
from orchestrator.server.records import RunRecord
from orchestrator.server.schemas import RunConfig, RunCreate


def thread_config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    """The LangGraph config that reads the thread with key ``thread`` (at a checkpoint,
    or its latest)."""
    configurable: dict[str, Any] = {"thread_id": thread}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def run_config(run: RunRecord, body: RunCreate, graph_id: str) -> dict[str, Any]:
    """The LangGraph config of a run of graph ``graph_id``: the client's, plus the thread
    and run identity."""
    given = body.config or RunConfig()
    identity = {
        "thread_id": run.thread_id,
        "run_id": run.run_id,
        "assistant_id": run.assistant_id,
        "graph_id": graph_id,
    }
    # The graph's thread is the thread key: two tenants' threads "t1" are two threads.
    # The tenant takes its turns of tool calls with it (orchestrator.fairshare): set here,
    # over any value of the client's or the assistant's.
    configurable: dict[str, Any] = {
        **given.configurable,
        **identity,
        "thread_id": run.thread_key,
        TENANT_KEY: run.tenant,
    }
    if body.checkpoint is not None:
        configurable.update(body.checkpoint.model_dump(exclude_none=True, exclude={"thread_id"}))
    if body.checkpoint_id:
        configurable["checkpoint_id"] = body.checkpoint_id
    config: dict[str, Any] = {
        "configurable": configurable,
        # A run taken over from a replica that went away is attempted again (runlease).
        "metadata": {**run.metadata, **identity, "run_attempt": run.attempt},
        "tags": list(given.tags),
        "run_id": uuid.UUID(run.run_id),
    }
    if given.recursion_limit is not None:
        config["recursion_limit"] = given.recursion_limit
    return config


def with_assistant(body: RunCreate, assistant: dict[str, Any]) -> RunCreate:
    """The run's request with its assistant's config and context beneath its own (the
    run's keys win; ``configurable`` and ``context`` are merged key by key)."""
    defaults = assistant.get("config") or {}
    context = assistant.get("context") or {}
    if not defaults and not context:
        return body
    given = body.config.model_dump(exclude_unset=True) if body.config else {}
    configurable = {**(defaults.get("configurable") or {}), **given.get("configurable", {})}
    merged = RunConfig.model_validate({**defaults, **given, "configurable": configurable})
    update: dict[str, Any] = {"config": merged}
    if context or body.context:
        update["context"] = {**context, **(body.context or {})}
    return body.model_copy(update=update)


def config_json(body: RunCreate) -> dict[str, Any]:
    """The config the client gave the run, as JSON (none: an empty ``configurable``)."""
    given = body.config.model_dump(mode="json", exclude_defaults=True) if body.config else {}
    return {**given, "configurable": dict(given.get("configurable") or {})}
