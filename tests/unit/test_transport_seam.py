"""The in-process dispatcher is a transport under the shared dispatcher: a call run in
process is watched, waited for, read and cancelled by the code that runs with Celery."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import pytest
from langchain_core.tools import tool

from orchestrator.call import PreparedCall
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.dispatch.transport import TransportDispatcher
from tool_workers.contract.errors import ResultTimeout
from tool_workers.contract.names import task_id_for, tool_queue
from tool_workers.contract.settings import Settings, ToolPolicies

pytestmark = pytest.mark.timeout(60)

TRANSPORT = {
    "_send",
    "_send_async",
    "_read_now",
    "_revoke_sent",
    "_publishing",
    "_epoch",
    "_before_watch_async",
    "_before_send",
    "_before_send_async",
    "_check_soon",
    "_answered",
    "link_trouble",
    "data_losses",
    "close",
}
"""What a transport may define; everything else of the shared dispatcher is shared."""

REGISTRY = {
    "served_tools",
    "served_tools_async",
    "served_versions",
    "note_placement",
    "note_placement_async",
}


def _shared() -> set[str]:
    return {
        name
        for name, value in vars(TransportDispatcher).items()
        if inspect.isfunction(value) and name not in TRANSPORT and name != "__init__"
    }


@tool
def slow(seconds: float) -> str:
    """Sleeps, saying nothing meanwhile."""
    time.sleep(seconds)
    return "woke"


@tool
def echo(text: str) -> str:
    """Echoes the text."""
    return text


def _call(dispatcher: InProcessDispatcher, name: str, args: dict[str, Any]) -> PreparedCall:
    call_id = f"{name}-{time.monotonic_ns()}"
    spec = dispatcher.served_tools()[name]
    return PreparedCall(
        tool=name, call_id=call_id, args=args, task_id=task_id_for(call_id), spec=spec
    )


def test_given_both_dispatchers_then_neither_redefines_a_shared_decision() -> None:
    shared = _shared()
    assert {"wait", "wait_async", "submit", "submit_async", "cancel", "_revocable"} <= shared
    for implementation in (InProcessDispatcher, CeleryDispatcher):
        own = {name for name, value in vars(implementation).items() if inspect.isfunction(value)}
        assert own & shared == set(), implementation.__name__
    in_process = {
        name for name, value in vars(InProcessDispatcher).items() if inspect.isfunction(value)
    }
    assert in_process <= TRANSPORT | REGISTRY | {"__init__", "_run", "_answer"}


def test_given_an_idle_timeout_when_an_in_process_call_goes_silent_then_it_is_answered_hung(
    dispatchers: Any,
) -> None:
    policies = ToolPolicies(tools={"slow": {"idle_timeout": 0.3}})
    dispatcher = dispatchers([slow], policies=policies)
    call = _call(dispatcher, "slow", {"seconds": 3})

    result = dispatcher.wait(call, timeout=10)

    assert result.status == "error" and result.error_kind == "hung"
    assert dispatcher.cancelled == [call.task_id]


def test_given_a_deadline_when_an_in_process_call_outlives_it_then_the_wait_raises(
    dispatchers: Any,
) -> None:
    dispatcher = dispatchers([slow])
    call = _call(dispatcher, "slow", {"seconds": 2})

    with pytest.raises(ResultTimeout):
        dispatcher.wait(call, timeout=0.2)


def test_given_a_signing_key_then_in_process_results_are_signed_and_checked(
    dispatchers: Any,
) -> None:
    settings = Settings(signing_key="k" * 32)
    dispatcher = dispatchers([echo], settings=settings)

    result = dispatcher.wait(_call(dispatcher, "echo", {"text": "hi"}), timeout=10)

    assert result.status == "success" and result.content == "hi"
    assert result.signature


def test_given_an_observer_then_it_hears_the_states_a_worker_stores(dispatchers: Any) -> None:
    dispatcher = dispatchers([echo])
    call = _call(dispatcher, "echo", {"text": "hi"})
    states: list[str | None] = []
    heard = threading.Event()

    def on_state(task_id: str, state: str | None, meta: dict[str, Any]) -> None:
        states.append(state)
        if state == "SUCCESS":
            heard.set()

    dispatcher.submit([call], on_state)
    result = dispatcher.wait(call, timeout=10)

    assert heard.wait(5)
    assert result.content == "hi"
    assert states == ["STARTED", "SUCCESS"]


def test_given_a_call_run_once_when_it_is_sent_again_then_it_is_answered_without_a_rerun(
    dispatchers: Any,
) -> None:
    ran: list[str] = []

    @tool
    def effect(text: str) -> str:
        """A counted side effect."""
        ran.append(text)
        return text

    dispatcher = dispatchers([effect])
    call = _call(dispatcher, "effect", {"text": "once"})

    first = dispatcher.wait(call, timeout=10)
    again = dispatcher.wait(call, timeout=10)

    assert first.content == again.content == "once"
    assert ran == ["once"]
    assert dispatcher.published[call.task_id] == 1


def test_given_tools_in_process_then_the_registry_serves_them_as_a_workers(
    dispatchers: Any,
) -> None:
    dispatcher = dispatchers([echo])

    spec = dispatcher.served_tools()["echo"]

    assert spec.queue == tool_queue("echo", spec.version)  # routed by tool
    assert "inject_messages" in spec.options  # what only the orchestrator decides
    assert dispatcher.served_versions("echo") == {spec.version: spec}
    assert dispatcher.served_versions("nothing") == {}
