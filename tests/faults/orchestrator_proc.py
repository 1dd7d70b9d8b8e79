"""An orchestrator process for the crash test: ``python -m tests.faults.orchestrator_proc``.

``start`` runs one agent turn (a fan-out of ``touch`` calls) on a thread with a SQLite
checkpointer; the test kills it mid-fan-out. ``resume`` continues the same thread in a new
process and prints the ToolMessages as JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from orchestrator import ScriptedChatModel
from orchestrator.agent import build_agent, checkpointer
from orchestrator.dispatch.fleet import close_all
from tool_workers.contract.settings import Settings

DURATIONS = [0.1, 0.1, 3.0, 3.0, 3.0]


def policy(messages: Sequence[BaseMessage]) -> AIMessage:
    if messages[-1].type == "human":
        return AIMessage(
            content="",
            id="ai-fanout",
            tool_calls=[
                {"name": "touch", "args": {"tag": f"c{i}", "seconds": s}, "id": f"c{i}"}
                for i, s in enumerate(DURATIONS)
            ],
        )
    return AIMessage(content="done")


def main(
    mode: str, broker_url: str, namespace: str, policy_path: str, db: str, thread: str
) -> None:
    settings = Settings(
        broker_url=broker_url,
        namespace=namespace,
        config=Path(policy_path),
        checkpoint_path=Path(db),
    )
    config = {"configurable": {"thread_id": thread}}
    with checkpointer(settings) as saver:
        agent = build_agent(
            settings, model=ScriptedChatModel(policy=policy), checkpointer=saver, wait_for_tools=15
        )
        state = agent.invoke({"messages": [("user", "go")]} if mode == "start" else None, config)
    close_all()
    print(
        json.dumps(
            {
                "tool_messages": [
                    m.content for m in state["messages"] if isinstance(m, ToolMessage)
                ],
                "last": state["messages"][-1].content,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
