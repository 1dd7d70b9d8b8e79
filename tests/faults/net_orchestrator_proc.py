"""An orchestrator on a host of its own: ``python -m tests.faults.net_orchestrator_proc``.

Run through ``ip netns exec`` by :mod:`tests.faults.test_net_orchestrator`, so every Redis
connection it makes crosses the test network's bridge, where the test cuts it.

``start`` discovers the fleet's tools, writes ``<signal dir>/ready`` and runs one agent
turn on a SQLite-checkpointed thread: the scripted model waits for ``<signal dir>/go``
(the test cuts the link, waits, then creates it) and answers with a fan-out of ``step``
calls. ``resume`` continues the thread (``invoke(None)``); ``close`` answers what is still
unanswered with ``close_pending_calls``. A ``start`` may be given a run deadline (seconds,
``with_deadline`` counted from the run's start; 0: none). Each mode prints one JSON line:
the error the run raised (if any), every ToolMessage of the thread, and when the run ended
and its deadline was (Unix time), so the test can tell how late a deadline error came.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from orchestrator import (
    ScriptedChatModel,
    aclose_pending_calls,
    close_pending_calls,
    with_deadline,
)
from orchestrator.agent import async_checkpointer, build_agent, checkpointer
from orchestrator.deadline import DEADLINE_KEY
from orchestrator.dispatch.fleet import close_all
from tool_workers.contract.settings import Settings

GO_WITHIN = 60.0
"""Seconds the scripted model waits for the test's go-ahead."""


def fan_out(calls: int, seconds: float, signals: Path) -> ScriptedChatModel:
    """A model that, once told to go, calls ``step`` ``calls`` times at once, then ends."""

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        if messages[-1].type != "human":
            return AIMessage(content="done")
        deadline = time.monotonic() + GO_WITHIN
        while not (signals / "go").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never said go")
            time.sleep(0.05)
        (signals / "fanout").touch()
        return AIMessage(
            content="",
            id="ai-fanout",
            tool_calls=[
                {"name": "step", "args": {"seconds": seconds}, "id": f"c{i}"} for i in range(calls)
            ],
        )

    return ScriptedChatModel(policy=policy)


CONFIG: dict[str, Any] = {"configurable": {"thread_id": "net-thread"}}


def run_config(mode: str, deadline: float) -> dict[str, Any]:
    """The run's config: a ``start`` with a deadline gets it."""
    return with_deadline(deadline, CONFIG) if mode == "start" and deadline > 0 else CONFIG


class Ended:
    """When the run ended and when its deadline was (Unix time; ``None``: no deadline)."""

    at: float = 0.0
    deadline: float | None = None


def run_sync(
    mode: str, settings: Settings, model: ScriptedChatModel, signals: Path, deadline: float
) -> tuple[str | None, list[BaseMessage]]:
    """Run ``mode`` with ``invoke``; the error it raised and the thread's messages."""
    error: str | None = None
    with checkpointer(settings) as saver:
        agent = build_agent(settings, model=model, checkpointer=saver, wait_for_tools=30)
        (signals / "ready").touch()
        config = run_config(mode, deadline)
        Ended.deadline = deadline_at(config)
        try:
            if mode == "close":
                close_pending_calls(agent, CONFIG, reason="the run failed")
            else:
                agent.invoke({"messages": [("user", "go")]} if mode == "start" else None, config)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        Ended.at = time.time()
        return error, agent.get_state(CONFIG).values.get("messages", [])


async def run_async(
    mode: str, settings: Settings, model: ScriptedChatModel, signals: Path, deadline: float
) -> tuple[str | None, list[BaseMessage]]:
    """Run ``mode`` with ``ainvoke``; the error it raised and the thread's messages."""
    error: str | None = None
    async with async_checkpointer(settings) as saver:
        # Discovery reads the registry (blocking): done before the loop runs any call.
        agent = await asyncio.to_thread(
            build_agent, settings, model=model, checkpointer=saver, wait_for_tools=30
        )
        (signals / "ready").touch()
        config = run_config(mode, deadline)
        Ended.deadline = deadline_at(config)
        try:
            if mode == "close":
                await aclose_pending_calls(agent, CONFIG, reason="the run failed")
            else:
                inputs = {"messages": [("user", "go")]} if mode == "start" else None
                await agent.ainvoke(inputs, config)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        Ended.at = time.time()
        state = await agent.aget_state(CONFIG)
        return error, state.values.get("messages", [])


def deadline_at(config: dict[str, Any]) -> float | None:
    """The run's deadline (Unix time) in ``config``, if it has one."""
    value = (config.get("configurable") or {}).get(DEADLINE_KEY)
    return float(value) if value is not None else None


def main(
    mode: str,
    flavour: str,
    broker_url: str,
    namespace: str,
    policy_path: str,
    db: str,
    signals: str,
    calls: str,
    seconds: str,
    deadline: str = "0",
) -> None:
    settings = Settings(
        broker_url=broker_url,
        namespace=namespace,
        config=Path(policy_path),
        checkpoint_path=Path(db),
    )
    model = fan_out(int(calls), float(seconds), Path(signals))
    if flavour == "async":
        error, messages = asyncio.run(
            run_async(mode, settings, model, Path(signals), float(deadline))
        )
    else:
        error, messages = run_sync(mode, settings, model, Path(signals), float(deadline))
    close_all()
    answers = [
        {"id": m.tool_call_id, "status": m.status, "content": m.content}
        for m in messages
        if isinstance(m, ToolMessage)
    ]
    outcome = {
        "error": error,
        "tool_messages": answers,
        "ended_at": Ended.at,
        "deadline_at": Ended.deadline,
    }
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
