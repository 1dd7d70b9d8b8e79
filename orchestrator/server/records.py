"""The records the HTTP service keeps of threads and runs, and their protocol shapes
(stored by :mod:`orchestrator.server.store`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orchestrator.server.schemas import TERMINAL_STATUSES
from orchestrator.server.tenancy import thread_key


def now_iso() -> str:
    """The current time as ISO 8601 with the UTC offset."""
    return datetime.now(UTC).isoformat()


@dataclass
class ThreadRecord:
    """What the service knows of a thread besides its checkpoints."""

    thread_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str = "idle"
    tenant: str = ""
    state_updated_at: str = ""
    """When the thread's state (status, values) last changed; its creation at first."""
    config: dict[str, Any] = field(default_factory=dict)
    """The config of the thread's runs, merged run by run (LangGraph's server keeps it)."""

    @property
    def key(self) -> str:
        """The thread key: ``<tenant>/<thread id>``."""
        return thread_key(self.tenant, self.thread_id)

    def to_api(self, values: Any = None) -> dict[str, Any]:
        """The protocol's ``Thread``."""
        return {
            "thread_id": self.thread_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "state_updated_at": self.state_updated_at or self.updated_at,
            "metadata": self.metadata,
            "status": self.status,
            "config": self.config,
            "values": values,
            "interrupts": {},
        }


@dataclass
class RunRecord:
    """What the service knows of a run."""

    run_id: str
    thread_id: str
    assistant_id: str
    created_at: str
    updated_at: str
    status: str
    replica: str
    metadata: dict[str, Any] = field(default_factory=dict)
    multitask_strategy: str = "enqueue"
    kwargs: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    tenant: str = ""
    attempt: int = 1
    """Which attempt of the run this is: 2 and on, taken over from a replica that went
    away (:mod:`orchestrator.server.runlease`)."""
    temporary: bool = False
    """Whether the run made its own thread (a stateless run's)."""

    @property
    def thread_key(self) -> str:
        """The key of the run's thread: ``<tenant>/<thread id>``."""
        return thread_key(self.tenant, self.thread_id)

    @property
    def done(self) -> bool:
        """Whether the run has finished (its status will not change again)."""
        return self.status in TERMINAL_STATUSES

    def to_api(self) -> dict[str, Any]:
        """The protocol's ``Run``, plus the owner replica and the error."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": self.multitask_strategy,
            "kwargs": self.kwargs,
            "replica": self.replica,
            "error": self.error,
        }
