"""A2A messages both ways: a message's parts as a run's input, a thread's messages and a
run's values as A2A history, answers and artifacts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def agent_message(text: str, task_id: str, context_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "kind": "message",
        "role": "ROLE_AGENT",
        "parts": [{"kind": "text", "text": text}],
        "messageId": str(uuid.uuid4()),
        "taskId": task_id,
    }
    if context_id is not None:
        message["contextId"] = context_id
    return message


def message_input(parts: list[Any], role: str, message_id: str) -> dict[str, Any]:
    """A run's input from an A2A message's parts.

    Raises:
        ValueError: a part that is not one of text, file or data (an object).
    """
    messages: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    has_files = any(isinstance(p, dict) and "file" in p for p in parts)
    for part in parts:
        if not isinstance(part, dict):
            raise ValueError("Each message part must be an object with 'text', 'data' or 'file'")
        present = [k for k in ("text", "file", "data") if k in part]
        if len(present) != 1:
            raise ValueError(
                "Each message part must contain exactly one of 'text', 'file' or 'data', "
                f"not {present}"
            )
        if "text" in part:
            if has_files:
                blocks.append({"type": "text", "text": part["text"]})
            else:
                messages.append({"role": role, "content": part["text"], "id": message_id})
        elif "file" in part:
            blocks.append(_file_block(part["file"]))
        else:
            if not isinstance(part["data"], dict):
                raise ValueError("DataPart must contain a JSON object in the 'data' field")
            data.update(part["data"])
    if blocks:
        messages.append({"role": role, "content": blocks, "id": message_id})
    if not messages and not data:
        raise ValueError("Message must contain at least one valid text, data, or file part")
    return {**({"messages": messages} if messages else {}), **data}


def _file_block(file: Any) -> dict[str, Any]:
    """A file part as a content block (a URI passed on, never fetched here)."""
    if not isinstance(file, dict):
        raise ValueError("FilePart must contain a 'file' object with 'bytes' or 'uri'")
    content, uri = file.get("bytes"), file.get("uri")
    if (content is None) == (uri is None):
        raise ValueError("FilePart 'file' must contain exactly one of 'bytes' or 'uri'")
    mime = file.get("mimeType")
    top = mime.split("/", 1)[0].lower() if isinstance(mime, str) else ""
    block: dict[str, Any] = {"type": top if top in ("image", "audio", "video") else "file"}
    block["base64" if content is not None else "url"] = content if content is not None else uri
    if mime:
        block["mime_type"] = mime
    if file.get("name"):
        block["extras"] = {"filename": file["name"]}
    return block


def _role(message: Any) -> str | None:
    """``ROLE_USER``/``ROLE_AGENT`` of a public message; ``None`` for system or tool."""
    if not isinstance(message, dict):
        return None
    kind = str(message.get("type") or "").lower().replace("_", "")
    role = str(message.get("role") or "").lower()
    if kind in ("human", "humanmessage", "humanmessagechunk") or role in ("human", "user"):
        return "ROLE_USER"
    if kind in ("ai", "aimessage", "aimessagechunk") or role in ("ai", "agent", "assistant"):
        return "ROLE_AGENT"
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b if isinstance(b, str) else str(b.get("text") or "")
            for b in content
            if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
        )
    return "" if content is None else str(content)


def history(values: Any, task_id: str, context_id: str, length: int | None) -> list[dict[str, Any]]:
    """The context's public turns as A2A messages (the last ``length`` of them)."""
    messages = values.get("messages") if isinstance(values, dict) else None
    out = []
    for message in messages or []:
        role = _role(message)
        text = _text(message.get("content")) if role else ""
        if role is None or (role == "ROLE_AGENT" and not text):
            continue
        out.append(
            {
                "kind": "message",
                "role": role,
                "parts": [{"kind": "text", "text": text}],
                "messageId": message.get("id") or str(uuid.uuid4()),
                "taskId": task_id,
                "contextId": context_id,
            }
        )
    return out if length is None else out[-length:] if length else []


def answer(values: Any) -> list[dict[str, Any]]:
    """The parts of the agent's last answer of this turn (the values as text if none)."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list) or not messages:
        return [{"kind": "text", "text": str(values)}]
    for message in reversed(messages):
        role = _role(message)
        if role == "ROLE_USER":
            break
        if role == "ROLE_AGENT" and (text := _text(message.get("content"))):
            return [{"kind": "text", "text": text}]
    return [{"kind": "text", "text": ""}]


def streamed_text(data: Any) -> str:
    """The agent's text in one ``messages`` event (its message, or message and metadata)."""
    items = data if isinstance(data, list) else [data]
    return "".join(_text(i.get("content")) for i in items if _role(i) == "ROLE_AGENT")


def interrupt_artifact(interrupts: list[Any]) -> dict[str, Any]:
    parts = []
    for found in interrupts:
        found = found if isinstance(found, dict) else {"value": found}
        parts.append({"kind": "data", "data": {"id": found.get("id"), "value": found.get("value")}})
    return {
        "artifactId": str(uuid.uuid4()),
        "name": "Interrupt",
        "description": "Agent requires input to continue",
        "parts": parts,
    }
