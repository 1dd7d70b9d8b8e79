"""A sync fan-out wider than LangGraph's thread pool runs at full width, with no run config.

The first hook of a fan-out publishes its siblings' calls that may go before their own
hooks (orchestrator.dispatch.ahead); each sibling's hook then waits for a result already
on its way. Given / When / Then, with the in-process dispatcher.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from orchestrator.call import PreparedCall
from orchestrator.dispatch import ahead
from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.middleware import SYNC_POOL, CeleryToolMiddleware
from orchestrator.node import RemoteToolNode
from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from tests.support.fleet import wait_until
from tool_workers.contract.settings import ToolPolicies

WIDTH = 40
"""Wider than any default pool (``min(32, cpu + 4)``)."""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TOOLFLEET_"):
            monkeypatch.delenv(name)


def rendezvous_tool(width: int) -> BaseTool:
    barrier = threading.Barrier(width, timeout=10)

    @tool
    def rendezvous(i: int) -> str:
        """Wait until every sibling call has started."""
        barrier.wait()
        return str(i)

    return rendezvous


def answers(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_given_a_wide_sync_fan_out_and_no_run_config_then_every_call_runs_at_once(
    dispatchers: Callable[..., InProcessDispatcher],
) -> None:
    # Every call waits for all of its siblings to start: on LangGraph's pool alone the
    # later calls would start only as threads free up, and the barrier would break.
    rendezvous = rendezvous_tool(WIDTH)
    dispatcher = dispatchers([rendezvous])
    calls = tool_calls_message([("rendezvous", {"i": i}) for i in range(WIDTH)])
    agent = create_agent(
        ScriptedChatModel(script=[calls, AIMessage("done")]),
        [rendezvous],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    state = agent.invoke({"messages": [HumanMessage("go")]})

    assert [m.content for m in answers(state)] == [str(i) for i in range(WIDTH)]
    assert all(m.status == "success" for m in answers(state))
    assert len(dispatcher.published) == WIDTH and set(dispatcher.published.values()) == {1}
    assert dispatcher.cancelled == []


def test_given_tools_condition_and_a_remote_tool_node_then_the_fan_out_runs_at_once(
    dispatchers: Callable[..., InProcessDispatcher],
) -> None:
    # One node runs every call of the message (ToolNode's own executor, the same pool size).
    rendezvous = rendezvous_tool(WIDTH)
    dispatcher = dispatchers([rendezvous])
    model = ScriptedChatModel(
        script=[
            tool_calls_message([("rendezvous", {"i": i}) for i in range(WIDTH)]),
            AIMessage("done"),
        ]
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", RemoteToolNode([rendezvous], dispatcher=dispatcher))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")

    state = graph.compile().invoke({"messages": [HumanMessage("go")]})

    assert [m.content for m in answers(state)] == [str(i) for i in range(WIDTH)]
    assert all(m.status == "success" for m in answers(state))
    assert set(dispatcher.published.values()) == {1}


class Running:
    """Counts the calls running at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


def test_given_a_tool_that_is_not_idempotent_then_no_call_of_it_goes_before_its_hook(
    dispatchers: Callable[..., InProcessDispatcher], caplog: pytest.LogCaptureFixture
) -> None:
    running = Running()

    @tool
    def transfer(i: int) -> str:
        """Move money (must never run twice)."""
        with running:
            time.sleep(0.05)
        return str(i)

    policies = ToolPolicies.model_validate({"tools": {"transfer": {"idempotent": False}}})
    dispatcher = dispatchers([transfer], policies=policies)
    calls = tool_calls_message([("transfer", {"i": i}) for i in range(WIDTH)])
    agent = create_agent(
        ScriptedChatModel(script=[calls, AIMessage("done")]),
        [transfer],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    with caplog.at_level(logging.WARNING, logger="toolfleet.orchestrator"):
        state = agent.invoke({"messages": [HumanMessage("go")]})

    assert [m.content for m in answers(state)] == [str(i) for i in range(WIDTH)]
    assert running.most <= SYNC_POOL
    said = [r.getMessage() for r in caplog.records if "max_concurrency" in r.getMessage()]
    assert len(said) == 1 and f"{WIDTH} of a sync fan-out's {WIDTH} tool calls" in said[0]


def test_given_max_concurrency_then_the_run_config_still_decides(
    dispatchers: Callable[..., InProcessDispatcher],
) -> None:
    running = Running()

    @tool
    def fetch(i: int) -> str:
        """Fetch a page."""
        with running:
            time.sleep(0.05)
        return str(i)

    dispatcher = dispatchers([fetch])
    calls = tool_calls_message([("fetch", {"i": i}) for i in range(WIDTH)])
    agent = create_agent(
        ScriptedChatModel(script=[calls, AIMessage("done")]),
        [fetch],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    state = agent.invoke({"messages": [HumanMessage("go")]}, {"max_concurrency": 2 * WIDTH})

    assert len(answers(state)) == WIDTH
    assert set(dispatcher.published.values()) == {1}


class Refuse(AgentMiddleware):
    """An outer middleware that answers one call itself (its inner hooks never see it)."""

    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if request.tool_call["id"] == self.call_id:
            return ToolMessage("refused", tool_call_id=self.call_id, status="error")
        return handler(request)


def test_given_an_outer_middleware_refuses_an_early_call_then_it_is_revoked(
    dispatchers: Callable[..., InProcessDispatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Longer than a stall of a loaded machine between two hooks (0.2 s was not: a sibling
    # whose hook came late was revoked as abandoned), shorter than the test's patience.
    monkeypatch.setattr(ahead, "ABANDON_AFTER", 1.5)

    @tool
    def fetch(i: int) -> str:
        """Fetch a page."""
        time.sleep(0.05)
        return str(i)

    dispatcher = dispatchers([fetch])
    calls = tool_calls_message([("fetch", {"i": i}) for i in range(WIDTH)])
    refused = calls.tool_calls[-1]["id"]
    assert refused is not None
    agent = create_agent(
        ScriptedChatModel(script=[calls, AIMessage("done")]),
        [fetch],
        middleware=[Refuse(refused), CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    state = agent.invoke({"messages": [HumanMessage("go")]})

    assert answers(state)[-1].content == "refused"
    assert [m.content for m in answers(state)[:-1]] == [str(i) for i in range(WIDTH - 1)]
    deadline = time.monotonic() + 10
    while len(dispatcher.cancelled) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Only the refused call was revoked: the others were each answered by their own hook.
    assert len(dispatcher.cancelled) == 1
    (task_id,) = dispatcher.cancelled
    assert task_id not in {m.response_metadata["toolfleet"]["task_id"] for m in answers(state)[:-1]}


def test_given_a_sibling_fails_the_run_then_calls_whose_hooks_never_came_are_revoked(
    dispatchers: Callable[..., InProcessDispatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local tool raising ends the superstep: LangGraph cancels the Send tasks not
    # started yet, so their calls published ahead must not be left running.
    monkeypatch.setattr(ahead, "ABANDON_AFTER", 0.2)

    @tool
    def fetch(i: int) -> str:
        """Fetch a page."""
        time.sleep(0.5)
        return str(i)

    @tool
    def crash() -> str:
        """Fail with an exception the agent does not catch."""
        raise KeyboardInterrupt

    dispatcher = dispatchers([fetch])
    calls = tool_calls_message(
        [("fetch", {"i": 0}), ("crash", {})] + [("fetch", {"i": i}) for i in range(1, WIDTH)]
    )
    agent = create_agent(
        ScriptedChatModel(script=[calls, AIMessage("done")]),
        [fetch, crash],
        middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
    )

    with pytest.raises(KeyboardInterrupt):
        agent.invoke({"messages": [HumanMessage("go")]})

    deadline = time.monotonic() + 10
    while not dispatcher.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dispatcher.cancelled, "the calls published ahead were left running"
    assert len(dispatcher.published) == WIDTH and set(dispatcher.published.values()) == {1}


def test_given_hooks_that_keep_coming_one_at_a_time_then_no_early_call_is_abandoned(
    dispatchers: Callable[..., InProcessDispatcher],
) -> None:
    # A sync fan-out wider than LangGraph's pool: each hook finds its result already in
    # and returns at once, so between two hooks none is running, again and again. The
    # fan-out is alive as long as hooks keep coming: only a fan-out with no hook for the
    # whole abandonment time gives up its unclaimed calls.
    abandon_after, gap, width = 0.6, 0.1, 12

    @tool
    def fetch(i: int) -> str:
        """Fetch a page."""
        return str(i)

    dispatcher = dispatchers([fetch])
    fan_out = ahead.Ahead(dispatcher, abandon_after=abandon_after)
    calls = [
        PreparedCall(tool="fetch", call_id=f"call_{i}", args={"i": i}, task_id=f"task_{i}")
        for i in range(width)
    ]
    assert fan_out.lead("scope")
    assert fan_out.publish("scope", calls) == width

    claimed = []
    for call in calls[:-1]:  # hooks one after another, none running in between
        ticket = fan_out.enter("scope", call.call_id)
        claimed.append(fan_out.attach(ticket, lambda *_: None))
        fan_out.leave(ticket)
        time.sleep(gap)  # the time between hooks is what is tested

    # Every hook found its call published ahead, and nothing was revoked meanwhile
    # (width x gap is twice the abandonment time).
    assert claimed == [True] * (width - 1)
    assert dispatcher.cancelled == []
    # The last call's hook never comes: it is revoked once no hook came for that long.
    wait_until(lambda: dispatcher.cancelled, 10, "the revocation of the unclaimed call")
    assert dispatcher.cancelled == [calls[-1].task_id]
