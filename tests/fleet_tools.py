"""Tools the integration and fault tests serve from real workers.

Side effects are counted in Redis (``TOOLFLEET_TEST_COUNTER_URL``), keyed by the call's
idempotency key, so a test can tell how many times each call really ran.
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any

import redis
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.config import get_stream_writer
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
from langgraph.store.base import BaseStore
from langgraph.types import Command
from pydantic import BaseModel

from tool_workers import current_call, heartbeat

LOCAL_RUNS: list[str] = []
"""Names of tools that ran in this process (the orchestrator's must stay empty)."""

_client: redis.Redis | None = None


def _counter() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["TOOLFLEET_TEST_COUNTER_URL"])
    return _client


def _ns() -> str:
    return os.environ.get("TOOLFLEET_NAMESPACE", "")


def record(kind: str) -> int:
    """Count one real execution of the current call; returns how many so far."""
    ctx = current_call()
    key = ctx.idempotency_key if ctx else "no-call"
    client = _counter()
    client.rpush(f"{_ns()}:effects:{kind}:log", key)
    return int(client.incr(f"{_ns()}:effects:{kind}:{key}"))


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    LOCAL_RUNS.append("add")
    return a + b


@tool
def whoami() -> str:
    """Report the process that ran the call."""
    LOCAL_RUNS.append("whoami")
    return f"pid={os.getpid()}"


@tool
def sleep_for(seconds: float, label: str = "") -> str:
    """Sleep, then report."""
    LOCAL_RUNS.append("sleep_for")
    time.sleep(seconds)
    return f"{label or 'slept'} {seconds}"


@tool
def boom(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"boom: {reason}")


@tool(response_format="content_and_artifact")
def with_artifact(n: int) -> tuple[str, dict[str, Any]]:
    """Content plus an artifact."""
    return f"{n} squares", {"squares": [i * i for i in range(n)]}


@tool
def blocks() -> list[dict[str, Any]]:
    """Content blocks."""
    return [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]


@tool(return_direct=True)
def finish(answer: str) -> str:
    """Return the answer straight to the user."""
    return f"final: {answer}"


@tool
def hang(seconds: float = 30.0) -> str:
    """Sleeps past its time limit (the soft limit interrupts it)."""
    time.sleep(seconds)
    return "woke up"


@tool
def hard_hang(seconds: float = 30.0) -> str:
    """Ignores the soft time limit, so only the hard limit stops it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except BaseException:  # swallowing the soft time limit is the point
            continue
    return "woke up"


@tool
def charge(amount: int, seconds: float = 0.0) -> str:
    """A non-idempotent side effect (counted), optionally slow."""
    n = record("charge")
    time.sleep(seconds)
    return f"charged {amount} (run {n})"


@tool
def touch(tag: str, seconds: float = 0.0) -> str:
    """An idempotent side effect (counted), optionally slow."""
    n = record("touch")
    time.sleep(seconds)
    return f"touched {tag} (run {n})"


@tool
def flaky(times: int) -> str:
    """Fails with ConnectionError the first ``times`` attempts of a call."""
    ctx = current_call()
    n = record("flaky")
    if n <= times:
        raise ConnectionError(f"transient failure {n}")
    return f"ok after {n} attempts (attempt {ctx.attempt if ctx else 0})"


class _Opaque:
    pass


@tool(response_format="content_and_artifact")
def opaque_artifact() -> tuple[str, Any]:
    """Its artifact is not JSON."""
    return "content", _Opaque()


class EchoInput(BaseModel):
    text: str


class EchoTool(BaseTool):
    """A BaseTool subclass (not a decorated function)."""

    name: str = "echo_cls"
    description: str = "Echo the text back."
    args_schema: type[BaseModel] = EchoInput

    def _run(self, text: str) -> str:
        LOCAL_RUNS.append("echo_cls")
        return f"echo: {text}"


echo_cls = EchoTool()


@tool
def slow_effect(seconds: float, tag: str = "") -> str:
    """Sleeps, then records its side effect: a call stopped early records nothing."""
    time.sleep(seconds)
    n = record("slow_effect")
    return f"done {tag} (run {n})"


# -- tools that take graph context (injected arguments), return Commands, stream progress


@tool
def my_call_id(note: str, call_id: Annotated[str, InjectedToolCallId]) -> str:
    """Report the tool call id it was given."""
    return f"{note}: {call_id}"


@tool
def count_todos(status: str, todos: Annotated[list[dict[str, Any]], InjectedState("todos")]) -> str:
    """Count the agent's todos with a status."""
    return f"{sum(1 for t in todos if t.get('status') == status)} {status}"


@tool
def state_keys(state: Annotated[dict[str, Any], InjectedState]) -> str:
    """List the state fields the tool was given."""
    return ",".join(sorted(state))


@tool
def runtime_info(label: str, runtime: ToolRuntime) -> str:
    """Describe the runtime the tool was given."""
    configurable = runtime.config.get("configurable", {})
    return json.dumps(
        {
            "label": label,
            "state": sorted(runtime.state),
            "context": runtime.context,
            "thread_id": configurable.get("thread_id"),
            "tags": runtime.config.get("tags"),
            "tool_call_id": runtime.tool_call_id,
            "has_store": runtime.store is not None,
        }
    )


@tool
def remember(key: str, value: str, store: Annotated[BaseStore, InjectedStore()]) -> str:
    """Save a value in the shared store."""
    namespace = tuple(os.environ.get("TOOLFLEET_TEST_STORE_NAMESPACE", "tft").split("/"))
    store.put(namespace, key, {"value": value})
    return f"remembered {key}"


@tool
def set_flag(value: str, call_id: Annotated[str, InjectedToolCallId]) -> Command:  # type: ignore[type-arg]
    """Set the agent's flag (updates graph state)."""
    return Command(
        update={
            "flag": value,
            "messages": [ToolMessage(f"flag is now {value}", tool_call_id=call_id)],
        }
    )


@tool
def progress(steps: int, delay: float) -> str:
    """Report each step on the stream while working."""
    write = get_stream_writer()
    for step in range(1, steps + 1):
        time.sleep(delay)
        write({"step": step, "of": steps})
    return f"did {steps} steps"


@tool
def quiet(seconds: float) -> str:
    """Works silently (no progress, no heartbeat)."""
    time.sleep(seconds)
    return "quiet done"


@tool
def chatty(seconds: float) -> str:
    """Works for a while, sending heartbeats."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        heartbeat()
        time.sleep(0.2)
    return "chatty done"
