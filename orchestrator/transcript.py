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
    answers = answer_pending(pending_calls(graph.get_state(config).values), reason)
    if answers:
        graph.update_state(config, {"messages": answers}, as_node="tools")
    return answers


async def aclose_pending_calls(
    graph: Any, config: dict[str, Any], reason: str = "the run was cancelled"
) -> list[ToolMessage]:
    """Async flavour of :func:`close_pending_calls`."""
    answers = answer_pending(pending_calls((await graph.aget_state(config)).values), reason)
    if answers:
        await graph.aupdate_state(config, {"messages": answers}, as_node="tools")
    return answers
