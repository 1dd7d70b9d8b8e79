"""What a running tool may know about its own call, without importing Celery."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallContext:
    """The identity of the call a tool is running for."""

    call_id: str
    """The model's ``tool_call_id``."""
    idempotency_key: str
    """Stable across redeliveries, retries of the same call and orchestrator restarts.

    Key external side effects on it (an idempotency header, a unique row) to make them
    safe to repeat.
    """
    thread_id: str | None
    run_id: str | None
    attempt: int
    """1 for the first run; higher when Celery retries the call after a transient error."""


_current: ContextVar[CallContext | None] = ContextVar("toolfleet_call", default=None)


def current_call() -> CallContext | None:
    """The call the running tool serves, or ``None`` outside a toolfleet worker call."""
    return _current.get()


@contextmanager
def call_scope(ctx: CallContext) -> Iterator[CallContext]:
    """Make ``ctx`` the current call for the duration of the block."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
