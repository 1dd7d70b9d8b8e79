"""The worker's message consumer: a call whose message cannot be read still gets an answer.

Celery acknowledges and logs a message it cannot decode (a pickled body it refuses, a
body that is not JSON) and stores nothing, so an orchestrator waiting for that call
would wait forever. The task id is in the message headers even when the body is
unreadable: this consumer records a failure for it, which the orchestrator turns into
an error ToolMessage.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.app.task import Context
from celery.worker.consumer import Consumer

from tool_workers.protocol import tool_from_task

log = logging.getLogger("toolfleet.worker")


class UnreadableCall(Exception):
    """Raised (stored as the call's failure) when a call's message cannot be decoded."""


class ToolfleetConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, plus a failure result for toolfleet calls it cannot decode."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A body that does not decode: Celery logs and acks it; answer the call too."""
        super().on_decode_error(message, exc)
        self._answer_unreadable(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """Refused content (pickle, YAML) or an invalid task message: answer the call too."""
        super().on_invalid_task(body, message, exc)
        self._answer_unreadable(message, exc)

    def _answer_unreadable(self, message: Any, exc: Exception) -> None:
        headers = getattr(message, "headers", None) or {}
        task_id, name = headers.get("id"), headers.get("task")
        if not task_id or not isinstance(name, str) or tool_from_task(name) is None:
            return
        reason = UnreadableCall(
            f"the message of this call could not be read ({type(exc).__name__}: {exc}); "
            f"content type {message.content_type!r}"
        )
        # The reply channel the call was sent with, so its orchestrator hears at once.
        request = Context(id=task_id, reply_to=(message.properties or {}).get("reply_to"))
        try:
            self.app.backend.mark_as_failure(task_id, reason, request=request, call_errbacks=False)
        except Exception:  # the result store may be down too; the log line stays
            log.exception("could not record the failure of unreadable call %s", task_id)
