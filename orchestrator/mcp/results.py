"""What crosses from toolfleet's side to an MCP client: results and progress.

A remote call ends in a ToolMessage (or a tool's Command); :func:`call_result` turns it
into MCP's ``CallToolResult``: LangChain content blocks as MCP content blocks, an error
ToolMessage as ``isError``, the structured content a worker's MCP tool returned (its
artifact) as ``structuredContent``. :class:`ProgressRelay` sends a call's progress events,
written from any thread, as ``notifications/progress`` of the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import anyio
from langchain_core.messages import ToolMessage
from mcp.server.session import ServerSession
from mcp.types import (
    AudioContent,
    CallToolResult,
    ContentBlock,
    ImageContent,
    ResourceLink,
    TextContent,
)

_END = object()
"""Marks the end of a relay's queue."""


def call_result(output: Any) -> CallToolResult:
    """A call's output (a ToolMessage, or a Command a tool returned) as an MCP result."""
    if not isinstance(output, ToolMessage):
        return CallToolResult(content=[text(json.dumps(_plain(output), default=str))])
    content = output.content
    blocks: list[ContentBlock] = (
        [text(content)] if isinstance(content, str) else [block(b) for b in content]
    )
    artifact = output.artifact
    structured = artifact.get("structured_content") if isinstance(artifact, Mapping) else None
    return CallToolResult(
        content=blocks,
        structuredContent=structured if isinstance(structured, dict) else None,
        isError=output.status == "error",
    )


def error_result(message: str) -> CallToolResult:
    """A call that could not be made, as the client's model reads it."""
    return CallToolResult(content=[text(message)], isError=True)


def text(value: str) -> TextContent:
    return TextContent(type="text", text=value)


def block(item: Any) -> ContentBlock:
    """One LangChain content block (or a bare string) as an MCP content block."""
    if isinstance(item, str):
        return text(item)
    if not isinstance(item, Mapping):
        return text(json.dumps(item, default=str))
    kind = item.get("type")
    mime = item.get("mime_type")
    if kind == "text" and isinstance(item.get("text"), str):
        return text(item["text"])
    if kind == "image" and item.get("base64") and mime:
        return ImageContent(type="image", data=item["base64"], mimeType=mime)
    if kind == "audio" and item.get("base64") and mime:
        return AudioContent(type="audio", data=item["base64"], mimeType=mime)
    if kind in ("image", "file", "audio") and item.get("url"):
        url = str(item["url"])
        return ResourceLink.model_validate(
            {
                "type": "resource_link",
                "name": url.rsplit("/", 1)[-1] or url,
                "uri": url,
                "mimeType": mime,
            }
        )
    return text(json.dumps(dict(item), default=str))


def _plain(output: Any) -> Any:
    update = getattr(output, "update", None)
    return {"update": update, "goto": getattr(output, "goto", None)} if update else output


class ProgressRelay:
    """Sends a call's progress events as MCP progress notifications, in order.

    Called from any thread (the result listener's); the notifications go out from the
    event loop the relay was made on. An event a worker's MCP tool relayed keeps its
    ``progress``, ``total`` and ``message``; any other is counted and sent as JSON.
    """

    def __init__(
        self, session: ServerSession, token: str | int, request_id: str | int | None
    ) -> None:
        self._session = session
        self._token = token
        self._request_id = None if request_id is None else str(request_id)
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._count = 0.0
        self._task: asyncio.Task[None] | None = None

    def __call__(self, payload: Any) -> None:
        if isinstance(payload, Mapping) and "toolfleet" in payload:
            return  # dispatched / started / finished: the call's own answer says enough
        self._loop.call_soon_threadsafe(self._queue.put_nowait, payload)

    async def __aenter__(self) -> ProgressRelay:
        self._task = asyncio.create_task(self._pump())
        return self

    async def __aexit__(self, *_: object) -> None:
        # Everything queued goes out before the answer: the pump ends at the mark, never
        # cancelled in the middle of a notification.
        self._queue.put_nowait(_END)
        if self._task is not None:
            with anyio.CancelScope(shield=True):
                await self._task

    async def _pump(self) -> None:
        while (payload := await self._queue.get()) is not _END:
            await self._send(payload)

    async def _send(self, payload: Any) -> None:
        self._count += 1
        progress, total, message = self._count, None, None
        if isinstance(payload, Mapping) and isinstance(payload.get("progress"), int | float):
            progress = float(payload["progress"])
            total = payload.get("total") if isinstance(payload.get("total"), int | float) else None
            message = payload.get("message") if isinstance(payload.get("message"), str) else None
        else:
            data = (
                {k: v for k, v in payload.items() if k != "tool_call_id"}
                if isinstance(payload, Mapping)
                else payload
            )
            message = json.dumps(data, default=str)
        with contextlib.suppress(Exception):  # progress never fails a call
            await self._session.send_progress_notification(
                self._token, progress, total, message, related_request_id=self._request_id
            )
