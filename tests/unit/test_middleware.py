"""``CeleryToolMiddleware`` and ``RemoteToolNode`` over the in-process dispatcher.

The agents are LangChain's own (``create_agent``) or hand-built LangGraph graphs, driven by
the scripted model; the dispatcher runs each call with the worker's code in a thread of
this process, so every path of the middleware runs without a broker.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Send

from orchestrator.call import PreparedCall
from orchestrator.deadline import with_deadline
from orchestrator.dispatch.in_process import InProcessDispatcher
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.node import RemoteToolNode
from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from tool_workers.contract.errors import RunDeadlineExceeded
from tool_workers.contract.names import call_key, task_id_for

Mode = Literal["invoke", "ainvoke"]
MODES: list[Mode] = ["invoke", "ainvoke"]

# --- tools ------------------------------------------------------------------------------


@tool
def nap(seconds: float, label: str) -> str:
    """Sleep ``seconds``, then return ``label``."""
    time.sleep(seconds)
    return label


@tool(return_direct=True)
def finish(answer: str) -> str:
    """Give the final answer directly to the user."""
    return answer


@tool
def boom(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


@tool(response_format="content_and_artifact")
def query(n: int) -> tuple[str, dict[str, Any]]:
    """Return a summary for the model and the rows as an artifact."""
    return f"{n} rows", {"rows": list(range(n)), "source": "db"}


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


TOOLS: list[BaseTool] = [nap, finish, boom, query, echo]


# --- helpers ----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TOOLFLEET_* variable of the calling shell changes the middleware's defaults."""
    for name in list(os.environ):
        if name.startswith("TOOLFLEET_"):
            monkeypatch.delenv(name)


@pytest.fixture
def dispatcher(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher],
) -> InProcessDispatcher:
    return dispatchers(TOOLS)


def agent_for(
    dispatcher: InProcessDispatcher,
    script: list[Any],
    tools: Sequence[BaseTool] = TOOLS,
    checkpointer: Any = None,
    **middleware: Any,
) -> Any:
    model = ScriptedChatModel(script=script)
    mw = CeleryToolMiddleware(dispatcher=dispatcher, **middleware)
    return create_agent(model, list(tools), middleware=[mw], checkpointer=checkpointer)


def run(graph: Any, mode: Mode, text: str = "go", config: Any = None) -> list[AnyMessage]:
    inputs = {"messages": [HumanMessage(text)]}
    if mode == "invoke":
        state = graph.invoke(inputs, config)
    else:
        state = asyncio.run(graph.ainvoke(inputs, config))
    return list(state["messages"])


def tool_messages(messages: Sequence[AnyMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def meta(message: ToolMessage) -> dict[str, Any]:
    toolfleet: dict[str, Any] = message.response_metadata["toolfleet"]
    return toolfleet


def naps(*plan: tuple[float, str]) -> AIMessage:
    return tool_calls_message([("nap", {"seconds": s, "label": label}) for s, label in plan])


# --- create_agent + middleware ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_given_calls_finishing_out_of_order_when_run_then_tool_messages_in_call_order(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    calls = naps((0.3, "slow"), (0.0, "fast"), (0.15, "middle"))
    agent = agent_for(dispatcher, [calls, AIMessage(content="done")])

    messages = run(agent, mode)

    answers = tool_messages(messages)
    assert [m.tool_call_id for m in answers] == [tc["id"] for tc in calls.tool_calls]
    assert [m.content for m in answers] == ["slow", "fast", "middle"]
    assert [m.status for m in answers] == ["success"] * 3
    assert all(m.name == "nap" for m in answers)
    assert messages[-1].content == "done"


@pytest.mark.parametrize("mode", MODES)
def test_given_two_turns_of_calls_when_run_then_each_call_published_exactly_once(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    script = [
        naps((0.05, "a"), (0.0, "b"), (0.02, "c")),
        naps((0.0, "d"), (0.01, "e")),
        AIMessage(content="done"),
    ]
    agent = agent_for(dispatcher, script)

    messages = run(agent, mode)

    assert len(tool_messages(messages)) == 5
    assert len(dispatcher.published) == 5
    assert set(dispatcher.published.values()) == {1}
    assert dispatcher.cancelled == []


def test_given_wide_sync_fan_out_when_invoked_then_calls_run_together(
    dispatcher: InProcessDispatcher,
) -> None:
    # LangGraph runs a superstep's Send tasks on the run config's max_concurrency threads
    # (min(32, cpu + 4) without one): with 20, the 20 calls overlap on any host.
    calls = naps(*[(0.3, f"n{i}") for i in range(20)])
    agent = agent_for(dispatcher, [calls, AIMessage(content="done")])

    started = time.perf_counter()
    messages = run(agent, "invoke", config={"max_concurrency": 20})
    elapsed = time.perf_counter() - started

    assert [m.content for m in tool_messages(messages)] == [f"n{i}" for i in range(20)]
    assert elapsed < 3.0, f"20 calls of 0.3 s took {elapsed:.2f} s"
    assert len(dispatcher.published) == 20 and set(dispatcher.published.values()) == {1}


def test_given_wide_async_fan_out_when_awaited_then_calls_run_together(
    dispatcher: InProcessDispatcher,
) -> None:
    calls = naps(*[(0.3, f"n{i}") for i in range(20)])
    agent = agent_for(dispatcher, [calls, AIMessage(content="done")])

    started = time.perf_counter()
    messages = run(agent, "ainvoke")
    elapsed = time.perf_counter() - started

    assert len(tool_messages(messages)) == 20
    assert elapsed < 3.0, f"20 calls of 0.3 s took {elapsed:.2f} s"


@pytest.mark.parametrize("mode", MODES)
def test_given_return_direct_tool_when_called_then_run_ends_with_its_message(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    model_turns = [
        tool_calls_message([("finish", {"answer": "42"})]),
        AIMessage(content="the model must not be asked again"),
    ]
    model = ScriptedChatModel(script=model_turns)
    agent = create_agent(model, TOOLS, middleware=[CeleryToolMiddleware(dispatcher=dispatcher)])

    messages = run(agent, mode)

    last = messages[-1]
    assert isinstance(last, ToolMessage)
    assert (last.name, last.content) == ("finish", "42")
    assert model.calls == 1


@pytest.mark.parametrize("mode", MODES)
def test_given_unknown_tool_name_when_called_then_error_naming_tools_and_run_goes_on(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    calls = tool_calls_message([("teleport", {"to": "mars"}), ("echo", {"text": "hi"})])
    agent = agent_for(dispatcher, [calls, AIMessage(content="done")])

    messages = run(agent, mode)

    unknown, echoed = tool_messages(messages)
    assert unknown.status == "error"
    assert unknown.tool_call_id == calls.tool_calls[0]["id"]
    assert unknown.content == (
        "Error: teleport is not a valid tool, try one of [boom, echo, finish, nap, query]."
    )
    assert meta(unknown)["error_kind"] == "unknown_tool"
    assert (echoed.status, echoed.content) == ("success", "hi")
    assert messages[-1].content == "done"
    assert len(dispatcher.published) == 1  # the unknown call never crossed the wire


@pytest.mark.parametrize("mode", MODES)
def test_given_tool_pinned_remote_no_worker_serves_when_called_then_unserved_error(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher], mode: Mode
) -> None:
    served_without_echo = dispatchers([nap])
    calls = tool_calls_message([("echo", {"text": "hi"})])
    agent = agent_for(
        served_without_echo,
        [calls, AIMessage(content="done")],
        unserved_wait=0.1,
        placement={"echo": "remote"},
    )

    messages = run(agent, mode)

    [error] = tool_messages(messages)
    assert error.status == "error"
    assert str(error.content).startswith("Error: no worker serves the tool 'echo'")
    assert meta(error)["error_kind"] == "unserved"
    assert messages[-1].content == "done"


@pytest.mark.parametrize("mode", MODES)
def test_given_agent_tool_no_worker_serves_when_called_then_it_runs_here(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher], mode: Mode
) -> None:
    served_without_echo = dispatchers([nap])
    calls = tool_calls_message([("echo", {"text": "hi"})])
    agent = agent_for(served_without_echo, [calls, AIMessage(content="done")])

    messages = run(agent, mode)

    [local] = tool_messages(messages)
    assert local.status == "success" and local.content == "hi"
    assert "toolfleet" not in local.response_metadata  # not sent to the workers
    assert served_without_echo.published == {}


@pytest.mark.parametrize("mode", MODES)
def test_given_tool_raising_when_called_then_error_message_for_the_model(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    calls = tool_calls_message([("boom", {"reason": "disk full"})])
    agent = agent_for(dispatcher, [calls, AIMessage(content="sorry")])

    messages = run(agent, mode)

    [error] = tool_messages(messages)
    assert error.status == "error"
    assert error.content == "Error: RuntimeError('disk full')\n Please fix your mistakes."
    assert meta(error)["error_kind"] == "tool_error"
    assert messages[-1].content == "sorry"


@pytest.mark.parametrize("mode", MODES)
def test_given_call_when_answered_then_metadata_names_worker_and_task(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    calls = tool_calls_message([("echo", {"text": "hi"})])
    agent = agent_for(dispatcher, [calls, AIMessage(content="done")], checkpointer=InMemorySaver())

    messages = run(agent, mode, config={"configurable": {"thread_id": "thread-7"}})

    [answer] = tool_messages(messages)
    [ai] = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    call_id = calls.tool_calls[0]["id"]
    assert call_id is not None
    assert meta(answer)["worker"] == "in-process"
    assert meta(answer)["error_kind"] is None
    assert meta(answer)["pid"] == os.getpid()
    assert meta(answer)["task_id"] == task_id_for(call_key("thread-7", ai.id, call_id))


@pytest.mark.parametrize("mode", MODES)
def test_given_content_and_artifact_tool_when_called_then_artifact_on_message(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    calls = tool_calls_message([("query", {"n": 3})])
    agent = agent_for(dispatcher, [calls, AIMessage(content="done")])

    messages = run(agent, mode)

    [answer] = tool_messages(messages)
    assert answer.content == "3 rows"
    assert answer.artifact == {"rows": [0, 1, 2], "source": "db"}


@pytest.mark.parametrize("mode", MODES)
def test_given_provider_reusing_call_ids_when_two_turns_then_each_turn_runs_its_own_call(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    def turn(text: str) -> AIMessage:
        return AIMessage(
            content="",
            tool_calls=[{"name": "echo", "args": {"text": text}, "id": "call_0"}],
        )

    agent = agent_for(
        dispatcher,
        [turn("first"), turn("second"), AIMessage(content="done")],
        checkpointer=InMemorySaver(),
    )

    messages = run(agent, mode, config={"configurable": {"thread_id": "t-reuse"}})

    assert [m.content for m in tool_messages(messages)] == ["first", "second"]
    assert len(dispatcher.published) == 2


@pytest.mark.parametrize("mode", MODES)
def test_given_eager_dispatch_when_passed_then_deprecated_and_same_answers(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    calls = naps((0.1, "slow"), (0.0, "fast"))
    with pytest.warns(DeprecationWarning, match="eager_dispatch"):
        agent = agent_for(dispatcher, [calls, AIMessage(content="done")], eager_dispatch=False)

    messages = run(agent, mode)

    assert [m.content for m in tool_messages(messages)] == ["slow", "fast"]
    assert len(dispatcher.published) == 2 and set(dispatcher.published.values()) == {1}
    assert messages[-1].content == "done"


def rendezvous_agent(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher], width: int
) -> Any:
    barrier = threading.Barrier(width, timeout=5)

    @tool
    def rendezvous(i: int) -> str:
        """Wait for every sibling call to start."""
        barrier.wait()
        return str(i)

    dispatcher = dispatchers([rendezvous])
    calls = tool_calls_message([("rendezvous", {"i": i}) for i in range(width)])
    return agent_for(dispatcher, [calls, AIMessage(content="done")], tools=[rendezvous])


def test_given_sync_run_with_max_concurrency_then_every_sibling_runs_at_once(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher],
) -> None:
    # Every call waits until all of its siblings have started: with fewer threads than
    # calls, the later calls would only start when a LangGraph thread frees up.
    width = 40
    agent = rendezvous_agent(dispatchers, width)

    messages = run(agent, "invoke", config={"max_concurrency": width})

    assert [m.content for m in tool_messages(messages)] == [str(i) for i in range(width)]
    assert all(m.status == "success" for m in tool_messages(messages))


# --- RemoteToolNode in hand-built graphs ------------------------------------------------


def graph_with_node(dispatcher: InProcessDispatcher, script: list[Any], *, fan_out: bool) -> Any:
    model = ScriptedChatModel(script=script)

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def send_each(state: MessagesState) -> Any:
        last = state["messages"][-1]
        if not isinstance(last, AIMessage) or not last.tool_calls:
            return END
        return [Send("tools", [call]) for call in last.tool_calls]

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", RemoteToolNode(TOOLS, dispatcher=dispatcher))
    graph.add_edge(START, "agent")
    if fan_out:
        graph.add_conditional_edges("agent", send_each, ["tools", END])
    else:
        graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


@pytest.mark.parametrize("fan_out", [False, True], ids=["tools_condition", "send_fan_out"])
@pytest.mark.parametrize("mode", MODES)
def test_given_remote_tool_node_in_graph_when_run_then_tool_messages_in_order(
    dispatcher: InProcessDispatcher, mode: Mode, fan_out: bool
) -> None:
    calls = tool_calls_message(
        [
            ("nap", {"seconds": 0.2, "label": "slow"}),
            ("nap", {"seconds": 0.0, "label": "fast"}),
            ("boom", {"reason": "nope"}),
        ]
    )
    graph = graph_with_node(dispatcher, [calls, AIMessage(content="done")], fan_out=fan_out)

    messages = run(graph, mode)

    answers = tool_messages(messages)
    assert [m.tool_call_id for m in answers] == [tc["id"] for tc in calls.tool_calls]
    assert [m.content for m in answers[:2]] == ["slow", "fast"]
    assert answers[2].status == "error"
    assert "Please fix your mistakes." in str(answers[2].content)
    assert all(meta(m)["worker"] == "in-process" for m in answers)
    assert messages[-1].content == "done"
    assert len(dispatcher.published) == 3 and set(dispatcher.published.values()) == {1}


# --- malformed arguments and unanswered calls -------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_malformed_json_arguments_get_error_tool_messages(mode: Mode) -> None:
    """Given a model message holding only a call whose arguments are not JSON, when the
    agent runs, then the model gets an error ToolMessage for it and is called again."""
    bad = AIMessage(
        content="",
        invalid_tool_calls=[
            {"name": "echo", "args": '{"text": ', "id": "bad-1", "error": "unterminated"}
        ],
    )
    model = ScriptedChatModel(script=[bad, AIMessage(content="recovered")])
    agent = create_agent(
        model, TOOLS, middleware=[CeleryToolMiddleware(dispatcher=InProcessDispatcher(TOOLS))]
    )

    payload = {"messages": [("user", "go")]}
    state = agent.invoke(payload) if mode == "invoke" else asyncio.run(agent.ainvoke(payload))

    (error,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert error.tool_call_id == "bad-1" and error.status == "error"
    assert "not valid JSON" in error.content and "Please fix your mistakes." in error.content
    assert state["messages"][-1].content == "recovered"
    assert model.calls == 2


def test_close_pending_calls_answers_unanswered_calls() -> None:
    """Given a thread whose run stopped with calls unanswered, when the pending calls are
    closed, then each gets an error ToolMessage and the thread can continue."""
    from orchestrator.transcript import close_pending_calls, pending_calls

    calls = tool_calls_message([("echo", {"text": "a"}), ("echo", {"text": "b"})])
    model = ScriptedChatModel(script=[calls, AIMessage(content="later")])
    agent = create_agent(
        model,
        TOOLS,
        middleware=[CeleryToolMiddleware(dispatcher=InProcessDispatcher(TOOLS))],
        checkpointer=InMemorySaver(),
        interrupt_before=["tools"],
    )
    config = {"configurable": {"thread_id": "stopped"}}
    agent.invoke({"messages": [("user", "go")]}, config)  # stops before the tools run
    assert len(pending_calls(agent.get_state(config).values)) == 2

    answers = close_pending_calls(agent, config, reason="the run was cancelled")

    assert [a.tool_call_id for a in answers] == [c["id"] for c in calls.tool_calls]
    assert all(a.status == "error" and "cancelled" in a.content for a in answers)
    assert pending_calls(agent.get_state(config).values) == []


@pytest.mark.parametrize("mode", MODES)
def test_given_unserved_tool_and_near_deadline_when_called_then_deadline_wins_over_wait(
    dispatchers: Callable[[Sequence[BaseTool]], InProcessDispatcher], mode: Mode
) -> None:
    # Given a tool no worker serves, a long unserved wait, and a run deadline 1 s away
    served_without_echo = dispatchers([nap])
    calls = tool_calls_message([("echo", {"text": "hi"})])
    agent = agent_for(
        served_without_echo,
        [calls, AIMessage(content="done")],
        unserved_wait=60,
        placement={"echo": "remote"},
    )

    # When it runs, Then it stops at the deadline, not after the unserved wait
    t0 = time.monotonic()
    with pytest.raises(RunDeadlineExceeded):
        run(agent, mode, config=with_deadline(1.0))
    assert time.monotonic() - t0 < 20  # generous: the point is "not 60 s"
    assert served_without_echo.published == {}


class ListState(TypedDict):
    messages: list[AnyMessage]  # no add_messages reducer: messages keep no ids


def id_less_graph(dispatcher: InProcessDispatcher, label: str) -> Any:
    """A hand-built graph whose AIMessage has no id and whose only call is ``call_0``."""

    def model(state: ListState) -> dict[str, Any]:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [*state["messages"], AIMessage(content="done")]}
        call = {"name": "echo", "args": {"text": label}, "id": "call_0", "type": "tool_call"}
        return {"messages": [*state["messages"], AIMessage(content="", tool_calls=[call])]}

    builder = StateGraph(ListState)
    builder.add_node("model", model)
    builder.add_node("tools", RemoteToolNode([echo], dispatcher=dispatcher))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile()


@pytest.mark.parametrize("mode", MODES)
def test_given_graphs_without_thread_or_message_ids_when_two_runs_call_0_then_each_runs(
    dispatcher: InProcessDispatcher, mode: Mode
) -> None:
    # Given two users' runs with no thread id and no message ids, both calling call_0
    answers = []
    for label in ("first user", "second user"):
        graph = id_less_graph(dispatcher, label)
        inputs = {"messages": [HumanMessage("go")]}
        state = graph.invoke(inputs) if mode == "invoke" else asyncio.run(graph.ainvoke(inputs))
        answers.append(tool_messages(state["messages"]))

    # Then each call ran for its own run: nobody got another run's result
    assert [[m.content for m in a] for a in answers] == [["first user"], ["second user"]]
    assert len(dispatcher.published) == 2 and set(dispatcher.published.values()) == {1}


def test_in_process_call_cancelled_before_it_starts_never_runs() -> None:
    """Given a call sent but not started (its worker busy), when it is cancelled and the
    resumed run waits for it again, then it is answered cancelled and the tool never
    runs, as a worker reading the revocation record answers it."""
    ran: list[int] = []
    release = threading.Event()

    @tool
    def hold() -> str:
        """Holds the only worker thread."""
        release.wait(10)
        return "held"

    @tool
    def effect(x: int) -> str:
        """A counted side effect."""
        ran.append(x)
        return "ran"

    dispatcher = InProcessDispatcher([hold, effect], max_workers=1)
    busy = PreparedCall(tool="hold", call_id="h", args={}, task_id=task_id_for("h"))
    call = PreparedCall(tool="effect", call_id="c", args={"x": 1}, task_id=task_id_for("c"))
    try:
        dispatcher.submit([busy, call])
        dispatcher.cancel([call])
        release.set()
        assert dispatcher.wait(busy, timeout=5).content == "held"
        result = dispatcher.wait(call, timeout=5)
    finally:
        dispatcher.close()

    assert result.status == "error" and result.error_kind == "cancelled"
    assert ran == []
    assert dispatcher.cancelled == [call.task_id]
