"""Keep a thread's transcript valid after a run stopped with tool calls unanswered.

A run that was cancelled or hit its deadline leaves an AIMessage whose calls have no
ToolMessage. Most model providers refuse a conversation in that state, so before the
thread continues, answer each such call with an error ToolMessage.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from orchestrator.messages import answer_pending


def pending_calls(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls of the last AIMessage that have no ToolMessage yet."""
    messages = state.get("messages") or []
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
            return [dict(c) for c in message.tool_calls if c.get("id") not in answered]
    return []


def answered_calls(state: dict[str, Any]) -> list[ToolMessage]:
    """The ToolMessages that answer calls of the last AIMessage.

    A stopped run's state shows the results of the calls that finished before it stopped
    (LangGraph keeps them as the step's pending writes), but writing the other answers
    starts a new step without them: :func:`close_pending_calls` writes them again
    (``add_messages`` replaces a message already in state by its id, so nothing doubles).
    """
    messages = state.get("messages") or []
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], AIMessage):
            return [m for m in messages[index + 1 :] if isinstance(m, ToolMessage)]
    return []


def close_pending_calls(
    graph: Any, config: dict[str, Any], reason: str = "the run was cancelled"
) -> list[ToolMessage]:
    """Answer every unanswered call of the thread in ``config`` with an error ToolMessage.

    Args:
        graph: The compiled agent graph (with a checkpointer).
        config: The thread's config (``{"configurable": {"thread_id": ...}}``).
        reason: Why the calls did not complete (shown to the model).

    Returns:
        The ToolMessages written (none if nothing was pending).
    """
    values = graph.get_state(config).values
    answers = answer_pending(pending_calls(values), reason)
    if answers:
        update = [*answered_calls(values), *answers]
        graph.update_state(config, {"messages": update}, as_node="tools")
    return answers


async def aclose_pending_calls(
    graph: Any, config: dict[str, Any], reason: str = "the run was cancelled"
) -> list[ToolMessage]:
    """Async flavour of :func:`close_pending_calls`."""
    values = (await graph.aget_state(config)).values
    answers = answer_pending(pending_calls(values), reason)
    if answers:
        update = [*answered_calls(values), *answers]
        await graph.aupdate_state(config, {"messages": update}, as_node="tools")
    return answers
