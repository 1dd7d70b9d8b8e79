"""Helpers of the scale-down and autoscaling trials: calls of the test tools sent to the
one queue of a kind, as the Kubernetes policy routes them."""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.call import PreparedCall
from tool_workers.contract.names import task_id_for


def calls(specs: Any, tool: str, n: int, **args: Any) -> list[PreparedCall]:
    """``n`` calls of ``tool`` (its spec from ``specs``), each with a fresh id as ``tag``."""
    spec = specs[tool]
    made = []
    for _ in range(n):
        call_id = f"sd-{uuid.uuid4().hex[:10]}"
        made.append(
            PreparedCall(
                tool=tool,
                call_id=call_id,
                args={"tag": call_id, **args} if tool == "touch" else {"amount": 1, **args},
                task_id=task_id_for(call_id),
                queue=spec.queue,
                spec=spec,
            )
        )
    return made
