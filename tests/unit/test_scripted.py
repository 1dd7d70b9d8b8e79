"""``ScriptedChatModel``: a deterministic tool-calling model that replays a script."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from orchestrator.scripted import ScriptedChatModel, tool_calls_message


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def test_given_script_when_called_repeatedly_then_steps_in_order() -> None:
    model = ScriptedChatModel(script=[AIMessage(content="one"), AIMessage(content="two")])

    first, second = model.invoke("hi"), model.invoke("hi")

    assert (first.content, second.content) == ("one", "two")
    assert model.calls == 2


def test_given_callable_step_when_called_then_it_sees_the_conversation() -> None:
    seen: list[Sequence[BaseMessage]] = []

    def step(messages: Sequence[BaseMessage]) -> AIMessage:
        seen.append(messages)
        return AIMessage(content=f"{len(messages)} message(s)")

    model = ScriptedChatModel(script=[step])
    reply = model.invoke([HumanMessage("a"), HumanMessage("b")])

    assert reply.content == "2 message(s)"
    assert [m.content for m in seen[0]] == ["a", "b"]


def test_given_script_used_up_when_policy_set_then_policy_answers() -> None:
    model = ScriptedChatModel(
        script=[AIMessage(content="scripted")],
        policy=lambda messages: AIMessage(content=f"policy after {messages[-1].content}"),
    )

    replies = [model.invoke(text).content for text in ("x", "y", "z")]

    assert replies == ["scripted", "policy after y", "policy after z"]


def test_given_only_policy_when_called_then_policy_answers() -> None:
    model = ScriptedChatModel(policy=lambda messages: AIMessage(content="always"))
    assert model.invoke("hi").content == "always"


def test_given_script_used_up_and_no_policy_when_called_then_raises() -> None:
    model = ScriptedChatModel(script=[AIMessage(content="only")])
    model.invoke("hi")
    with pytest.raises(RuntimeError, match="script exhausted after 1 model calls"):
        model.invoke("hi")


def test_given_tool_calls_without_ids_when_replayed_then_unique_ids_assigned() -> None:
    message = AIMessage(
        content="",
        tool_calls=[
            {"name": "echo", "args": {"text": "a"}, "id": None},
            {"name": "echo", "args": {"text": "b"}, "id": None},
            {"name": "echo", "args": {"text": "c"}, "id": "kept"},
        ],
    )
    model = ScriptedChatModel(script=[message])

    reply = model.invoke("hi")

    assert isinstance(reply, AIMessage)
    ids = [tc["id"] for tc in reply.tool_calls]
    assert all(ids) and len(set(ids)) == 3
    assert ids[2] == "kept"
    assert [tc["args"]["text"] for tc in reply.tool_calls] == ["a", "b", "c"]


def test_given_tool_calls_message_then_calls_in_order_with_fresh_ids() -> None:
    message = tool_calls_message([("echo", {"text": "a"}), ("echo", {"text": "b"})], "thinking")
    again = tool_calls_message([("echo", {"text": "a"})])

    assert message.content == "thinking"
    assert [tc["args"] for tc in message.tool_calls] == [{"text": "a"}, {"text": "b"}]
    ids = {tc["id"] for tc in message.tool_calls} | {tc["id"] for tc in again.tool_calls}
    assert len(ids) == 3


def test_given_tools_when_bound_then_model_still_replays_script() -> None:
    model = ScriptedChatModel(script=[tool_calls_message([("echo", {"text": "a"})])])

    bound = model.bind_tools([echo])
    reply = bound.invoke("hi")

    assert isinstance(reply, AIMessage)
    assert [tc["name"] for tc in reply.tool_calls] == ["echo"]
    assert model.calls == 1


def test_given_script_when_called_async_then_same_replay() -> None:
    model = ScriptedChatModel(script=[AIMessage(content="one"), AIMessage(content="two")])

    async def run() -> list[str]:
        return [str((await model.ainvoke("hi")).content) for _ in range(2)]

    assert asyncio.run(run()) == ["one", "two"]


def test_given_calls_as_pairs_and_a_string_then_an_agent_runs_without_ids_written() -> None:
    # The form the docs show for running an agent over one's own tools with no API key.
    from langchain.agents import create_agent

    model = ScriptedChatModel(script=[[("echo", {"text": "a"}), ("echo", {"text": "b"})], "done"])
    agent = create_agent(model, [echo])

    messages = agent.invoke({"messages": [("user", "go")]})["messages"]

    call_ids = [call["id"] for call in messages[1].tool_calls]
    assert len(set(call_ids)) == 2 and all(call_ids)
    assert [m.content for m in messages[2:4]] == ["a", "b"]
    assert messages[-1].content == "done"


def test_given_an_aimessage_with_an_id_of_none_then_it_gets_one() -> None:
    step = AIMessage(content="", tool_calls=[{"name": "echo", "args": {"text": "x"}, "id": None}])
    reply = ScriptedChatModel(script=[step]).invoke("hi")
    assert isinstance(reply, AIMessage)
    assert reply.tool_calls[0]["id"]
