"""Remote tools inside the LangChain ecosystem: other middleware's tools stay local,
injected state and runtime, stores, Commands, live progress, Deep Agents."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NotRequired

import pytest
from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import TodoListMiddleware
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from orchestrator import CeleryToolMiddleware, ScriptedChatModel, discover_tools, dispatcher_for
from orchestrator.scripted import tool_calls_message
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)


def turns(*steps: Sequence[tuple[str, dict[str, Any]]]) -> ScriptedChatModel:
    """A model making each step's calls in turn, then answering "done"."""
    script: list[Any] = [tool_calls_message(list(step)) for step in steps]
    return ScriptedChatModel(script=[*script, AIMessage(content="done")])


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def run(agent: Any, mode: str, config: Any = None, **inputs: Any) -> dict[str, Any]:
    payload = {"messages": [("user", "go")], **inputs}
    if mode == "sync":
        return agent.invoke(payload, config)
    return asyncio.run(agent.ainvoke(payload, config))


@pytest.fixture
def tools(shared_fleet: Settings) -> list[Any]:
    dispatcher = dispatcher_for(settings=shared_fleet)
    return discover_tools(dispatcher=dispatcher, require=["count_todos", "progress"], wait=15)


@pytest.fixture
def middleware(shared_fleet: Settings) -> Callable[..., CeleryToolMiddleware]:
    def make(**options: Any) -> CeleryToolMiddleware:
        return CeleryToolMiddleware(dispatcher=dispatcher_for(settings=shared_fleet), **options)

    return make


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_todo_middleware_tools_stay_local_and_remote_tools_read_its_state(
    mode: str, tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given TodoListMiddleware and remote tools, when the model writes todos and a remote
    tool reads them through InjectedState, then write_todos ran here (it updates state),
    the remote tool saw exactly the todos, and the run completes."""
    todos = [
        {"content": "survey", "status": "completed"},
        {"content": "summarise", "status": "pending"},
        {"content": "ship", "status": "pending"},
    ]
    model = turns(
        [("write_todos", {"todos": todos})],
        [("count_todos", {"status": "pending"}), ("add", {"a": 1, "b": 2})],
    )
    agent = create_agent(model, tools, middleware=[TodoListMiddleware(), middleware()])

    state = run(agent, mode)

    written, counted, added = tool_messages(state)
    assert "toolfleet" not in written.response_metadata  # ran here, through the handler
    assert state["todos"] == todos
    assert counted.content == "2 pending"
    assert counted.response_metadata["toolfleet"]["worker"].startswith("tf-shared-")
    assert added.content == "3"
    assert state["messages"][-1].content == "done"


class FlagState(AgentState):  # type: ignore[type-arg]
    flag: NotRequired[str]
    plan: NotRequired[str]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_injected_call_id_state_and_runtime(
    mode: str, tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given remote tools taking InjectedToolCallId, the whole InjectedState and a
    ToolRuntime, when called, then each gets its call id, the state without the message
    history, the JSON context, and the whitelisted config."""
    model = turns(
        [("my_call_id", {"note": "mine"}), ("state_keys", {}), ("runtime_info", {"label": "r"})]
    )
    agent = create_agent(model, tools, middleware=[middleware()], state_schema=FlagState)
    config = {"configurable": {"thread_id": "inject-thread"}, "tags": ["t1"]}

    payload = {"messages": [("user", "go")], "plan": "fast"}
    if mode == "sync":
        state = agent.invoke(payload, config, context={"user": "ada"})
    else:
        state = asyncio.run(agent.ainvoke(payload, config, context={"user": "ada"}))

    mine, keys, info = tool_messages(state)
    assert mine.content == f"mine: {mine.tool_call_id}"
    assert "messages" not in keys.content.split(",")
    assert "plan" in keys.content.split(",")
    runtime = json.loads(info.content)
    assert runtime["label"] == "r"
    assert "messages" not in runtime["state"] and "plan" in runtime["state"]
    assert runtime["context"] == {"user": "ada"}
    assert runtime["thread_id"] == "inject-thread"
    assert "t1" in runtime["tags"]
    assert runtime["tool_call_id"] == info.tool_call_id
    assert runtime["has_store"] is False


def test_value_that_is_not_json_is_refused_naming_the_field(
    tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given a run context that cannot be JSON, when a ToolRuntime tool is called, then
    the model gets an error naming the field and nothing is dispatched."""
    agent = create_agent(
        turns([("runtime_info", {"label": "x"})]), tools, middleware=[middleware()]
    )

    state = agent.invoke({"messages": [("user", "go")]}, context={"handle": object()})

    (error,) = tool_messages(state)
    assert error.status == "error"
    assert "context.handle" in error.content and "cannot be sent as JSON" in error.content


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_remote_tool_returning_command_updates_state(
    mode: str, tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given a remote tool returning Command(update=...), when called, then its update
    (state field and its own ToolMessage) is applied as a local tool's would be."""
    agent = create_agent(
        turns([("set_flag", {"value": "green"})]),
        tools,
        middleware=[middleware()],
        state_schema=FlagState,
    )

    state = run(agent, mode)

    (message,) = tool_messages(state)
    assert state["flag"] == "green"
    assert message.content == "flag is now green"
    assert state["messages"][-1].content == "done"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_progress_streams_live_in_order(
    mode: str, tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given a remote tool writing progress with get_stream_writer(), when streamed with
    stream_mode="custom", then its events arrive in order, tagged with the tool_call_id,
    while it is still running (the first well before it finishes)."""
    agent = create_agent(
        turns([("progress", {"steps": 5, "delay": 0.3})]), tools, middleware=[middleware()]
    )
    payload = {"messages": [("user", "go")]}
    arrivals: list[tuple[float, dict[str, Any]]] = []

    if mode == "sync":
        for chunk in agent.stream(payload, stream_mode="custom"):
            arrivals.append((time.monotonic(), chunk))
    else:

        async def collect() -> None:
            async for chunk in agent.astream(payload, stream_mode="custom"):
                arrivals.append((time.monotonic(), chunk))

        asyncio.run(collect())

    steps = [(t, c) for t, c in arrivals if "step" in c]
    finished = next(t for t, c in arrivals if c.get("toolfleet", {}).get("event") == "finished")
    call_id = next(c["toolfleet"]["tool_call_id"] for _, c in arrivals if "toolfleet" in c)
    assert [c["step"] for _, c in steps] == [1, 2, 3, 4, 5]
    assert {c["tool_call_id"] for _, c in steps} == {call_id}
    assert finished - steps[0][0] > 0.8  # the first step came ~1.2 s before the end


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_silent_call_past_its_idle_timeout_is_stopped(
    mode: str, tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given tools with a 1 s idle timeout, when one works silently for 6 s and another
    sends heartbeats, then the silent one is stopped as hung within a few seconds and the
    one with heartbeats finishes."""
    agent = create_agent(
        turns([("quiet", {"seconds": 6}), ("chatty", {"seconds": 2})]),
        tools,
        middleware=[middleware()],
    )

    t0 = time.monotonic()
    quiet, chatty = tool_messages(run(agent, mode))

    assert quiet.status == "error" and "no progress for 1 s" in quiet.content
    assert chatty.status == "success" and chatty.content == "chatty done"
    assert time.monotonic() - t0 < 5


def test_placement_override_and_same_name_different_tool(
    tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given a local tool named like a served one but with other arguments, and a served
    tool pinned local, when called, then both run here; the placement is logged."""
    from langchain_core.tools import tool

    @tool
    def add(x: str) -> str:
        """A different add: takes a string."""
        return f"local add {x}"

    @tool
    def whoami() -> str:
        """Local twin of the served whoami."""
        return "local whoami"

    mw = middleware(placement={"whoami": "local"})
    agent = create_agent(
        turns([("add", {"x": "y"}), ("whoami", {})]),
        [add, whoami, *[t for t in tools if t.name not in ("add", "whoami")]],
        middleware=[mw],
    )

    added, who = tool_messages(agent.invoke({"messages": [("user", "go")]}))

    assert added.content == "local add y"
    assert who.content == "local whoami"
    table = mw.rules.table([add, whoami], mw.dispatcher.served_tools())
    assert table["add"] == {
        "placement": "local",
        "reason": "a worker serves a different tool of that name",
    }
    assert table["whoami"]["reason"] == "placement override"
    # Published for `toolfleet status` at the agent's first model call.
    from orchestrator.cli.status import collect

    (record,) = [r for r in collect(mw.dispatcher.settings).placement if r["pid"] == os.getpid()]
    assert record["tools"]["add"]["placement"] == "local"
    assert record["tools"]["count_todos"]["placement"] == "remote"


def test_deep_agent_user_tools_remote_builtin_tools_local(
    tools: list[Any], middleware: Callable[..., CeleryToolMiddleware]
) -> None:
    """Given create_deep_agent with the user's remote tools, a todo list and toolfleet's
    middleware, when the model uses the todo and virtual-filesystem tools (graph state)
    and a remote tool, then the state tools run here and the user tool on a worker."""
    from deepagents import create_deep_agent

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        if not done:
            return tool_calls_message(
                [
                    ("write_todos", {"todos": [{"content": "add", "status": "in_progress"}]}),
                    ("write_file", {"file_path": "/notes.md", "content": "remote adds\n"}),
                    ("add", {"a": 20, "b": 22}),
                ]
            )
        if len(done) == 3:
            return tool_calls_message([("read_file", {"file_path": "/notes.md"})])
        return AIMessage(content="done")

    user_tools = [t for t in tools if t.name in ("add", "whoami")]
    agent = create_deep_agent(
        model=ScriptedChatModel(policy=policy),
        tools=user_tools,
        middleware=[TodoListMiddleware(), middleware()],
    )

    state = agent.invoke({"messages": [("user", "go")]})

    by_name = {m.name: m for m in tool_messages(state)}
    assert by_name["add"].content == "42"
    assert by_name["add"].response_metadata["toolfleet"]["worker"].startswith("tf-shared-")
    for local in ("write_todos", "write_file", "read_file"):
        assert "toolfleet" not in by_name[local].response_metadata, local
    assert "remote adds" in str(by_name["read_file"].content)
    assert state["todos"] == [{"content": "add", "status": "in_progress"}]
    assert state["messages"][-1].content == "done"


def test_injected_store_is_shared_by_workers_and_the_agent(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any], postgres_url: str
) -> None:
    """Given workers and an agent configured with the same store, when a remote tool saves
    a value through InjectedStore, then the orchestrator's store has it; a fleet without a
    store answers such a call with an error naming the setting."""
    from langgraph.store.postgres import PostgresStore

    database = postgres_url
    namespace = ("tft", uuid.uuid4().hex[:8])
    with_store = make_settings(store_url=database)
    start_worker(
        with_store,
        pool="threads",
        concurrency=4,
        extra_env={"TOOLFLEET_TEST_STORE_NAMESPACE": "/".join(namespace)},
    )
    without_store = make_settings()
    start_worker(without_store, pool="threads", concurrency=4)

    def run_remember(settings: Settings) -> ToolMessage:
        dispatcher = dispatcher_for(settings=settings)
        found = discover_tools(dispatcher=dispatcher, require=["remember"], wait=15)
        agent = create_agent(
            turns([("remember", {"key": "colour", "value": "blue"})]),
            found,
            middleware=[CeleryToolMiddleware(dispatcher=dispatcher)],
        )
        (message,) = tool_messages(agent.invoke({"messages": [("user", "go")]}))
        return message

    saved = run_remember(with_store)
    refused = run_remember(without_store)

    assert saved.content == "remembered colour"
    with PostgresStore.from_conn_string(database) as store:
        item = store.get(namespace, "colour")
        assert item is not None and item.value == {"value": "blue"}
        store.delete(namespace, "colour")
    assert refused.status == "error" and "TOOLFLEET_STORE_URL" in refused.content


@pytest.fixture
def builtin_fleet(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> Settings:
    """A worker serving the default (built-in) toolset: read_file, write_file, grep, ..."""
    settings = make_settings(tool_modules=())
    start_worker(settings, pool="threads", concurrency=4)
    return settings


def test_deep_agent_keeps_its_filesystem_when_the_fleet_serves_tools_of_the_same_names(
    builtin_fleet: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Given the default workers (whose read_file, write_file and grep clash with Deep
    Agents' file tools) and the Deep Agents agent of docs/ecosystem.md, when the model
    writes and reads /notes.md and lists the workspace, then /notes.md is in Deep Agents' state
    filesystem, the model was bound to Deep Agents' file tools and offered the fleet's
    other tools, list_dir ran on a worker, and each clash was logged as a warning."""
    from deepagents import create_deep_agent
    from langchain.agents.middleware import wrap_model_call

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        if not done:
            return tool_calls_message(
                [
                    ("write_file", {"file_path": "/notes.md", "content": "X is small\n"}),
                    ("list_dir", {"path": "."}),
                ]
            )
        if len(done) == 2:
            return tool_calls_message([("read_file", {"file_path": "/notes.md"})])
        return AIMessage(content="done")

    bound: list[dict[str, Any]] = []

    @wrap_model_call  # innermost: sees the tools the model is bound to
    def record_tools(request: Any, handler: Callable[[Any], Any]) -> Any:
        bound.append({t.name: set(t.args) for t in request.tools if hasattr(t, "args")})
        return handler(request)

    dispatcher = dispatcher_for(settings=builtin_fleet)
    discover_tools(dispatcher=dispatcher, require=["read_file", "list_dir"], wait=15)
    agent = create_deep_agent(
        model=ScriptedChatModel(policy=policy),
        middleware=[
            TodoListMiddleware(),
            CeleryToolMiddleware(dispatcher=dispatcher, discover=True),
            record_tools,
        ],
    )

    with caplog.at_level("WARNING", logger="toolfleet.orchestrator"):
        state = agent.invoke({"messages": [("user", "Research X and write notes to /notes.md")]})

    assert "X is small" in str(state["files"]["/notes.md"])
    by_name = {m.name: m for m in tool_messages(state)}
    assert "X is small" in str(by_name["read_file"].content)
    for local in ("write_file", "read_file"):
        assert "toolfleet" not in by_name[local].response_metadata, local
        assert by_name[local].status != "error", by_name[local]
    assert by_name["list_dir"].response_metadata["toolfleet"]["worker"]
    assert by_name["list_dir"].status == "success"
    first = bound[0]
    assert "file_path" in first["read_file"] and "file_path" in first["write_file"]
    assert {"list_dir", "run_python", "echo"} <= set(first)  # the fleet's other tools
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for clash in ("read_file", "write_file", "grep"):
        assert sum(f"fleet's tool '{clash}'" in line for line in warned) == 1, warned
    assert state["messages"][-1].content == "done"
