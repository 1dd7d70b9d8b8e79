"""A worker dies mid-call: the call is not lost, and a non-idempotent one never runs twice."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage

from orchestrator import CeleryToolMiddleware, ScriptedChatModel, discover_tools, dispatcher_for
from tests.support.fleet import effects, running_pid, wait_started, wait_until
from tool_workers.contract.names import call_key, task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


class AgentRun:
    """One agent turn making a single call, run in a background thread."""

    def __init__(self, settings: Settings, tool: str, args: dict[str, Any]) -> None:
        self.thread_id = f"t-{uuid.uuid4().hex[:8]}"
        self.call_id = f"call-{uuid.uuid4().hex[:8]}"
        ai = AIMessage(
            content="",
            id=f"ai-{uuid.uuid4().hex[:8]}",
            tool_calls=[{"name": tool, "args": args, "id": self.call_id, "type": "tool_call"}],
        )
        self.task_id = task_id_for(call_key(self.thread_id, ai.id, self.call_id))
        model = ScriptedChatModel(script=[ai, AIMessage(content="done")])
        dispatcher = dispatcher_for(settings=settings)
        tools = discover_tools(dispatcher=dispatcher, require=[tool], wait=15)
        self.agent = create_agent(
            model, tools, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)]
        )
        self.state: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.state = self.agent.invoke(
                {"messages": [("user", "go")]}, {"configurable": {"thread_id": self.thread_id}}
            )
        except BaseException as exc:
            self.error = exc

    def start(self) -> AgentRun:
        self._thread.start()
        return self

    def result(self, timeout: float = 60) -> ToolMessage:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the run did not finish"
        assert self.error is None, repr(self.error)
        assert self.state is not None
        (message,) = [m for m in self.state["messages"] if isinstance(m, ToolMessage)]
        assert self.state["messages"][-1].content == "done"
        return message


def kill_pool_child(settings: Settings, counter: Any, tool: str, task_id: str) -> None:
    pid = running_pid(settings, task_id)
    # Well inside the call: its side effect has happened, the tool is still running.
    wait_until(lambda: effects(counter, settings, tool).get(task_id) == 1, 20, "the effect")
    os.kill(pid, signal.SIGKILL)


def crash_trial(
    settings: Settings, counter: Any, tool: str
) -> tuple[ToolMessage, dict[str, int], str]:
    args: dict[str, Any] = {"amount": 7} if tool == "charge" else {"tag": "7"}
    # 5 s: the kill must land while the tool still runs, after the start and its effect
    # were seen; with 2 s a loaded machine's polling once came after the tool returned.
    run = AgentRun(settings, tool, {**args, "seconds": 5})
    run.start()
    kill_pool_child(settings, counter, tool, run.task_id)
    message = run.result()
    return message, effects(counter, settings, tool), run.task_id


def test_idempotent_call_reruns_after_pool_child_is_killed(
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
    broker_settings: dict[str, Any],
) -> None:
    """Given an idempotent call running in a prefork child, when the child is SIGKILLed
    (as an OOM kill would), then the call runs again and the run completes."""
    settings = fault_settings(**broker_settings)
    start_worker(settings, pool="prefork", concurrency=2)
    start_worker(settings, pool="prefork", concurrency=2)

    message, runs, task_id = crash_trial(settings, counter, "touch")

    assert message.status == "success", message.content
    assert message.content == "touched 7 (run 2)"
    assert runs[task_id] == 2


def test_non_idempotent_call_is_not_rerun_after_pool_child_is_killed(
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
    broker_settings: dict[str, Any],
) -> None:
    """Given a non-idempotent call, when its pool child is SIGKILLed mid-call, then it is
    not run again: the model gets an error saying it may have partially run."""
    settings = fault_settings(**broker_settings)
    start_worker(settings, pool="prefork", concurrency=2)

    message, runs, task_id = crash_trial(settings, counter, "charge")

    assert message.status == "error"
    assert "may have partially run" in message.content
    assert runs[task_id] == 1
    assert message.response_metadata["toolfleet"]["error_kind"] == "redelivered"


def test_call_of_a_killed_worker_is_redelivered_to_another(
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
    broker: str,
    broker_settings: dict[str, Any],
) -> None:
    """Given two workers, when the one running a call is SIGKILLed whole (main process and
    pool), then the broker redelivers the call and the other worker runs it; the run
    completes (Redis: after the visibility timeout; RabbitMQ: as soon as the dead
    worker's connection closes)."""
    settings = fault_settings(**broker_settings)
    first = start_worker(settings, pool="prefork", concurrency=1)
    second = start_worker(settings, pool="prefork", concurrency=1)
    run = AgentRun(settings, "touch", {"tag": "w", "seconds": 2}).start()
    started = wait_started(settings, run.task_id)
    victim, survivor = (first, second) if started["hostname"] == first.hostname else (second, first)
    wait_until(lambda: effects(counter, settings, "touch").get(run.task_id) == 1, 20, "the effect")

    t0 = time.monotonic()
    victim.kill()
    message = run.result(timeout=90)
    took = time.monotonic() - t0
    print(f"{broker}: the call completed on the survivor {took:.1f} s after the kill")

    assert message.status == "success"
    assert message.response_metadata["toolfleet"]["worker"] == survivor.hostname
    assert effects(counter, settings, "touch")[run.task_id] == 2
    # visibility timeout (8 + 1 + 2 s) + restore scan (5 s) + the call itself (2 s)
    assert took < 11 + 5 + 2 + 10


@pytest.mark.soak
@pytest.mark.parametrize("trial", range(10))
def test_pool_child_kill_soak(
    trial: int,
    fault_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    counter: Any,
) -> None:
    """Many trials of both kinds of call, killed at different points of the call."""
    settings = fault_settings()
    start_worker(settings, pool="prefork", concurrency=2)
    for tool in ("touch", "charge"):
        args: dict[str, Any] = {"amount": trial} if tool == "charge" else {"tag": str(trial)}
        run = AgentRun(settings, tool, {**args, "seconds": 1})
        run.start()
        pid = running_pid(settings, run.task_id)
        time.sleep(0.1 * (trial % 8))
        os.kill(pid, signal.SIGKILL)
        message = run.result()
        # Trial 0 kills right after the start: the tool may not have made its effect yet.
        runs = effects(counter, settings, tool).get(run.task_id, 0)
        if tool == "charge":
            assert runs <= 1  # never run again, whether it made its effect or not
            assert message.status == "error" or "(run 1)" in message.content
        else:
            assert message.status == "success"
            assert runs >= 1
