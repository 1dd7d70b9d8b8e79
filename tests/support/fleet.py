"""Fleets for tests: settings in a fresh namespace, worker environments, side-effect
counters, and waits on the state a test means (never a fixed sleep)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import redis_client
from tool_workers.contract.marker import MARKER, CallMarker, marker_key
from tool_workers.contract.names import result_key
from tool_workers.contract.settings import Settings

REPO = Path(__file__).resolve().parents[2]
TEST_POLICY = REPO / "tests" / "fleet_policy.toml"
FAULT_POLICY = REPO / "tests" / "faults" / "fault_policy.toml"
TEST_QUEUES = ("tools", "prefork", "threads", "sandbox", "slow")
"""Every queue the test policies and fleets use (RabbitMQ's are deleted by name)."""
RUN_ID = uuid.uuid4().hex[:8]
"""This test run's id: every namespace it makes starts with ``tft-<id>-``."""


def new_namespace() -> str:
    """A key namespace no other test or test run uses."""
    return f"tft-{RUN_ID}-{uuid.uuid4().hex[:8]}"


def fleet_settings(redis_url: str, workdir: Path, **overrides: Any) -> Settings:
    """Settings for a test fleet, in a fresh namespace unless one is given."""
    values: dict[str, Any] = {
        "broker_url": redis_url,
        "namespace": new_namespace(),
        "tool_modules": ("tests.fleet_tools",),
        "config": TEST_POLICY,
        "workspace_root": workdir / "workspace",
        "registry_refresh": 1.0,
        "unserved_wait": 2.0,
    }
    values.update(overrides)
    return Settings(**values)


def worker_env(settings: Settings) -> dict[str, str]:
    """Environment the test tools need on the worker side."""
    return {
        "PYTHONPATH": str(REPO),
        "TOOLFLEET_TEST_COUNTER_URL": settings.own_redis_url,
    }


def effects(client: redis.Redis, settings: Settings, kind: str) -> dict[str, int]:
    """How many times each call (by idempotency key) of ``kind`` really ran."""
    prefix = f"{settings.namespace}:effects:{kind}:"
    runs: dict[str, int] = {}
    for raw in client.lrange(f"{prefix}log", 0, -1):
        key = raw.decode()
        runs[key] = runs.get(key, 0) + 1
    return runs


def one_turn(calls: Sequence[tuple[str, dict[str, Any]]]) -> ScriptedChatModel:
    """A model that makes ``calls`` once, then answers with the tool results it saw."""

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        if messages[-1].type == "human":
            return tool_calls_message(calls)
        results = [m.content for m in messages if isinstance(m, ToolMessage)]
        return AIMessage(content=f"done: {len(results)} results")

    return ScriptedChatModel(policy=policy)


def rounds(calls: Sequence[Sequence[tuple[str, dict[str, Any]]]]) -> ScriptedChatModel:
    """A model that makes each round of calls in turn, then answers."""

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        done = sum(1 for m in messages if isinstance(m, AIMessage))
        if done < len(calls):
            return tool_calls_message(calls[done])
        return AIMessage(content="done")

    return ScriptedChatModel(policy=policy)


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "the condition",
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``condition`` until it returns something true; that value. A try that raises
    one of ``ignoring`` counts as false.

    Raises:
        AssertionError: not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except ignoring:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.02)


def call_states(settings: Settings) -> Counter[str]:
    """How many calls of the namespace the result backend holds in each Celery state."""
    client = redis_client(settings.backend_url, settings)
    try:
        keys = list(client.scan_iter(match=f"{settings.namespace}:celery-task-meta-*", count=1000))
        raws = client.mget(keys) if keys else []
    finally:
        client.close()
    return Counter(str(json.loads(raw)["status"]) for raw in raws if raw is not None)


def started_calls(settings: Settings) -> int:
    """How many calls of the namespace a worker has started (their markers say so)."""
    client = redis_client(settings.own_redis_url, settings)
    try:
        keys = list(client.scan_iter(match=f"{settings.key_prefix}{MARKER}*", count=1000))
        markers = [CallMarker.parse(raw) for raw in client.mget(keys)] if keys else []
        return sum(1 for m in markers if m is not None and m.starts > 0)
    finally:
        client.close()


def running_calls(settings: Settings) -> int:
    """How many calls of the namespace a worker started that have no result stored yet."""
    client = redis_client(settings.own_redis_url, settings)
    try:
        keys = list(client.scan_iter(match=f"{settings.key_prefix}{MARKER}*", count=1000))
        markers = [CallMarker.parse(raw) for raw in client.mget(keys)] if keys else []
        started = [
            key.decode().rsplit(MARKER, 1)[1]
            for key, marker in zip(keys, markers, strict=True)
            if marker is not None and marker.starts > 0
        ]
        results = (
            client.mget([result_key(settings.namespace, t) for t in started]) if started else []
        )
        return sum(1 for raw in results if raw is None)
    finally:
        client.close()


def wait_started(settings: Settings, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until a worker has started the call; the worker and process (``hostname``,
    ``pid``) its marker names."""
    client = redis_client(settings.own_redis_url, settings)
    key = marker_key(settings.key_prefix, task_id)

    def started() -> dict[str, Any] | None:
        marker = CallMarker.parse(client.get(key))
        if marker is None or marker.starts == 0:
            return None
        return {"hostname": marker.worker, "pid": marker.pid}

    try:
        return dict(wait_until(started, timeout, f"the start of call {task_id}"))
    finally:
        client.close()


def running_pid(settings: Settings, task_id: str, timeout: float = 20.0) -> int:
    """Wait until a pool process runs the call; its pid, as the worker answers ``inspect
    active`` (a call's marker names the process that started it: a prefork worker's main
    process)."""
    app = create_app(settings)

    def running() -> int | None:
        for requests in (app.control.inspect(timeout=0.5).active() or {}).values():
            for request in requests:
                if request.get("id") == task_id and request.get("worker_pid"):
                    return int(request["worker_pid"])
        return None

    try:
        return int(wait_until(running, timeout, f"call {task_id} in a pool process"))
    finally:
        app.close()


def result_state(settings: Settings, task_id: str) -> str | None:
    """The Celery state stored for a call (``None`` if nothing is stored)."""
    app = create_app(settings)
    client = redis_client(settings.backend_url, settings)
    try:
        raw = client.get(app.backend.get_key_for_task(task_id))
    finally:
        client.close()
        app.close()
    return None if raw is None else str(json.loads(raw)["status"])


def workers_idle(app: Any) -> bool:
    """Whether every worker answered and none is running a call."""
    replies = app.control.inspect(timeout=1.0).active() or {}
    return bool(replies) and not any(replies.values())


def run_in_thread(
    agent: Any, mode: str, config: Any = None
) -> tuple[threading.Thread, dict[str, Any]]:
    """Start one run of ``agent`` (``mode`` "sync" or "async") on a daemon thread; the
    thread and the outcome it fills in (``state``, or ``error``)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            payload = {"messages": [("user", "go")]}
            outcome["state"] = (
                agent.invoke(payload, config)
                if mode == "sync"
                else asyncio.run(agent.ainvoke(payload, config))
            )
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    return runner, outcome


def ledger_runs(path: Path) -> dict[str, Counter[str]]:
    """How many times each call of :mod:`tests.ledger_tools` ran, by kind and tag, from
    its ledger file (kept outside Redis)."""
    runs: dict[str, Counter[str]] = {"charge": Counter(), "touch": Counter()}
    if path.exists():
        for line in path.read_text().splitlines():
            kind, tag, _pid = line.split()
            runs[kind][tag] += 1
    return runs
