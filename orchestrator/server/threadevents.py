"""A thread's runs as the thread-centric protocol's events (``client.threads.stream``).

``POST /threads/{thread_id}/stream/events`` reads the thread's runs oldest first, each
from the start of its event log (the log every other stream of the run reads), and turns
each logged part into the protocol's envelope, as LangGraph's server does (a run already
over when the connection opens is sent only if :func:`replayed`)::

    {"type": "event", "event_id": "<log entry id>", "seq": 7, "method": "values",
     "params": {"namespace": [], "timestamp": 1700000000000, "data": {...}}}

- a run started by a thread command logged these events whole (``graph.astream_events``,
  ``version="v3"``): they are passed on, their ``values`` messages in the protocol's
  shape, a subgraph's ``custom:<name>`` as ``custom`` ``{name, payload}``;
- a run started by another route logged the older stream modes: its ``values``,
  ``updates`` (``{node, values}``) and ``custom`` parts are passed on (its older message
  and debug parts have no protocol form and are left out, as on LangGraph's server);
- each run opens with ``lifecycle`` ``running`` and ends with ``completed``, ``failed``
  (with the run's error) or ``interrupted``; an interrupt is an ``input.requested``
  event (``{interrupt_id, payload}``) followed by ``lifecycle`` ``interrupted``.

``seq`` numbers every event of the thread in that order, before the connection's filter,
so it is the same on every connection: a client that reconnects with ``since`` gets only
the events after it. ``event_id`` is the log entry's id (``<id>.<n>`` for the further
events one entry makes, ``synth:<run_id>:...`` for lifecycle and input events), which
clients use to drop an event they already have.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.server.encoding import dumps, loads
from orchestrator.server.errors import NotFound
from orchestrator.server.eventlog import END, Entry, parse_id
from orchestrator.server.records import RunRecord
from orchestrator.server.services import Services
from orchestrator.server.streaming import HEARTBEAT

CHANNELS = frozenset(
    {
        "values",
        "updates",
        "checkpoints",
        "messages",
        "tools",
        "custom",
        "lifecycle",
        "input",
        "tasks",
    }
)
"""The channels a client may subscribe to (and ``custom:<name>``)."""

MAX_CHANNELS = 64
MAX_NAMESPACES = 64
MAX_SEGMENTS = 32
MAX_SEGMENT_CHARS = 256
MAX_DEPTH = 1_000
MAX_SEQ = 2**53 - 1

TERMINAL = {"success": "completed", "error": "failed", "interrupted": "interrupted"}
"""A run's final status as the lifecycle event it ends with."""

Event = dict[str, Any]


@dataclass(frozen=True)
class Filter:
    """What one connection asked for: channels, namespace prefixes and their depth."""

    channels: frozenset[str]
    namespaces: tuple[tuple[str, ...], ...] | None = None
    depth: int | None = None

    def matches(self, event: Event) -> bool:
        """Whether the event is on one of the channels, under one of the namespaces."""
        method = str(event.get("method", ""))
        channel = "input" if method == "input.requested" else method
        params = event.get("params") or {}
        if channel not in self.channels:
            data = params.get("data")
            name = data.get("name") if channel == "custom" and isinstance(data, dict) else None
            if not (isinstance(name, str) and f"custom:{name}" in self.channels):
                return False
        if self.namespaces is None:
            return True
        namespace = tuple(params.get("namespace") or ())
        for prefix in self.namespaces:
            if namespace[: len(prefix)] != prefix:
                continue
            if self.depth is None or len(namespace) - len(prefix) <= self.depth:
                return True
        return False


def parse_filter(body: Any) -> tuple[Filter, int | None]:
    """The filter and ``since`` of a ``stream/events`` body.

    Raises:
        ValueError: no channels, an unknown channel, or a malformed field (its message
            names the field).
    """
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object with channels")
    unknown = sorted(str(k)[:60] for k in body.keys() - FIELDS)
    if unknown:
        raise ValueError(f"unknown fields: {', '.join(unknown[:10])}")
    channels = body.get("channels")
    if not isinstance(channels, list) or not channels or len(channels) > MAX_CHANNELS:
        raise ValueError(f"channels is required: a non-empty array (at most {MAX_CHANNELS})")
    bad = [c for c in channels if not _is_channel(c)]
    if bad:
        shown = ", ".join(repr(c)[:60] for c in bad[:5])
        raise ValueError(
            f"channels contains unsupported entries: {shown}. Allowed: "
            f"{', '.join(sorted(CHANNELS))}, or any `custom:<name>`."
        )
    namespaces = body.get("namespaces")
    prefixes: tuple[tuple[str, ...], ...] | None = None
    if namespaces is not None:
        if not isinstance(namespaces, list) or len(namespaces) > MAX_NAMESPACES:
            raise ValueError(f"namespaces must be an array (at most {MAX_NAMESPACES})")
        for ns in namespaces:
            if not (
                isinstance(ns, list)
                and len(ns) <= MAX_SEGMENTS
                and all(isinstance(s, str) and len(s) <= MAX_SEGMENT_CHARS for s in ns)
            ):
                raise ValueError("namespaces must be arrays of strings")
        prefixes = tuple(tuple(ns) for ns in namespaces) or None
    depth = body.get("depth")
    if depth is not None and not _count(depth, MAX_DEPTH):
        raise ValueError(f"depth must be an integer from 0 to {MAX_DEPTH}")
    since = body.get("since")
    if since is not None and not _count(since, MAX_SEQ):
        raise ValueError(f"since must be an integer from 0 to {MAX_SEQ}")
    return Filter(frozenset(channels), prefixes, depth), since


def _count(value: Any, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


CHANNEL_PATTERN = f"^({'|'.join(sorted(CHANNELS))}|custom:[^\\n\\r\\u2028\\u2029]+)$"
"""What a channel name is (``custom:<name>``: the events of a stream transformer)."""

FIELDS = frozenset({"channels", "namespaces", "depth", "since"})


def _is_channel(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > MAX_SEGMENT_CHARS:
        return False
    return re.fullmatch(CHANNEL_PATTERN, value) is not None


@dataclass
class RunEvents:
    """Turns one run's logged parts into protocol events (without ``seq``)."""

    run: RunRecord
    graph_name: str
    interrupted: bool = False
    _asked: set[str] = field(default_factory=set)

    def lifecycle(self, status: str, error: str | None = None) -> Event:
        """The root's lifecycle event ``status``."""
        data: dict[str, Any] = {"event": status, "graph_name": self.graph_name}
        if error is not None:
            data["error"] = error
        return _event(f"synth:{self.run.run_id}:lc||{status}", "lifecycle", [], data)

    def end(self, status: str) -> list[Event]:
        """The run's closing lifecycle event (none after its interrupt's)."""
        if self.interrupted:
            return []
        final = TERMINAL.get(status, "completed")
        error = None
        if final == "failed":
            found = self.run.error or {}
            error = str(found.get("message") or found.get("error") or "run failed")
        return [self.lifecycle(final, error)]

    def entry(self, entry: Entry) -> list[Event]:
        """The protocol events of one logged part (none for parts without a form)."""
        name, *suffix = entry.event.split("|")
        try:
            data = loads(entry.data)
        except ValueError:
            return []
        stamp = parse_id(entry.id)[0]
        if isinstance(data, dict) and data.get("type") == "event" and "method" in data:
            events = self._protocol(data, stamp)
        else:
            events = self._legacy(name, list(suffix), data, stamp)
        for n, event in enumerate(events):
            if not event.get("event_id"):
                event["event_id"] = entry.id if n == 0 else f"{entry.id}.{n}"
        return events

    def _protocol(self, logged: dict[str, Any], stamp: int) -> list[Event]:
        method = str(logged.get("method"))
        raw = logged.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        namespace = [str(n) for n in params.get("namespace") or ()]
        stamp = params["timestamp"] if isinstance(params.get("timestamp"), int) else stamp
        data = params.get("data")
        if method == "lifecycle" and not namespace:
            return []  # the run's own lifecycle comes from its record
        if method == "debug":
            return []
        if method == "messages":
            if isinstance(data, list) and data and isinstance(data[0], dict):
                data = data[0]  # (payload, metadata)
            if not (isinstance(data, dict) and isinstance(data.get("event"), str)):
                return []
        if method.startswith("custom:"):
            data = {"name": method[len("custom:") :], "payload": data}
            method = "custom"
        out: list[Event] = []
        if method == "values":
            interrupts = params.get("interrupts")
            out.extend(
                self._interrupts(namespace, interrupts if isinstance(interrupts, list) else [])
            )
            out.extend(self._interrupts(namespace, _interrupts_in(data)))
            data = state_payload(data)
        elif method == "updates":
            data = state_payload(data)
        node = params.get("node")
        if method == "updates" and isinstance(data, dict) and not isinstance(node, str):
            node = data.get("node")
        if method == "tools" and isinstance(data, dict):
            data = dict(data)
            tagged = data.pop("__node", None)
            node = node if isinstance(node, str) else tagged
        event = _event("", method, namespace, data, stamp)
        if isinstance(node, str) and node:
            event["params"]["node"] = node
        if method == "tools":
            return [event, *_tool_message(namespace, data, stamp)]
        return [*out, event]  # an interrupt's events before the values that carry it

    def _legacy(self, mode: str, namespace: list[str], data: Any, stamp: int) -> list[Event]:
        if mode == "values":
            asks = self._interrupts(namespace, _interrupts_in(data))
            if not isinstance(data, dict) or not {k for k in data if k != "__interrupt__"}:
                return asks
            return [*asks, _event("", "values", namespace, state_payload(data), stamp)]
        if mode == "updates":
            if not isinstance(data, dict):
                return []
            if len(data) == 1:
                node, values = next(iter(data.items()))
                if node == "__interrupt__":
                    return self._interrupts(namespace, values if isinstance(values, list) else [])
                values = values if isinstance(values, dict) else {"value": values}
                update = {"node": node, "values": state_payload(values)}
                event = _event("", "updates", namespace, update, stamp)
                event["params"]["node"] = node
                return [event]
            return [_event("", "updates", namespace, {"values": state_payload(data)}, stamp)]
        if mode == "custom":
            return [_event("", "custom", namespace, data, stamp)]
        return []

    def _interrupts(self, namespace: list[str], interrupts: Iterable[Any]) -> list[Event]:
        out: list[Event] = []
        for found in interrupts:
            if not isinstance(found, dict) or not isinstance(found.get("id"), str):
                continue
            interrupt_id = found["id"]
            if interrupt_id in self._asked:
                continue
            self._asked.add(interrupt_id)
            data: dict[str, Any] = {"interrupt_id": interrupt_id}
            if "value" in found:
                data["payload"] = found["value"]
            ns_key = "|".join(namespace)
            event_id = f"synth:{self.run.run_id}:input|{ns_key}|{interrupt_id}"
            out.append(_event(event_id, "input.requested", namespace, data))
        if out and not self.interrupted:
            self.interrupted = True
            out.append(self.lifecycle("interrupted"))
        return out


def _tool_message(namespace: list[str], data: Any, stamp: int) -> list[Event]:
    """A finished tool call's output as a ``tool`` message on the ``messages`` channel,
    under the namespace ``tools:<tool_call_id>`` (as LangGraph's server mirrors it)."""
    if not isinstance(data, dict) or data.get("event") != "tool-finished":
        return []
    output = data.get("output")
    if not isinstance(output, dict):
        return []
    call_id = data.get("tool_call_id")
    if not isinstance(call_id, str):
        call_id = (
            output.get("tool_call_id") if isinstance(output.get("tool_call_id"), str) else None
        )
    message_id = output.get("id") if isinstance(output.get("id"), str) and output["id"] else None
    message_id = message_id or (f"tool-{call_id}" if call_id else None)
    if message_id is None:
        return []
    content = output.get("content")
    if not isinstance(content, str):
        content = "" if content is None else dumps(content).decode()
    start: dict[str, Any] = {"event": "message-start", "role": "tool", "id": message_id}
    if call_id is not None:
        start["tool_call_id"] = call_id
    where = [*namespace, f"tools:{call_id}"] if call_id is not None else namespace
    text = {"type": "text", "text": content}
    parts = (
        start,
        {"event": "content-block-start", "index": 0, "content": {"type": "text", "text": ""}},
        {"event": "content-block-delta", "index": 0, "content": text},
        {"event": "content-block-finish", "index": 0, "content": text},
        {"event": "message-finish", "metadata": {}},
    )
    return [_event("", "messages", where, part, stamp) for part in parts]


def _interrupts_in(values: Any) -> list[Any]:
    found = values.get("__interrupt__") if isinstance(values, dict) else None
    return found if isinstance(found, list) else []


def _event(
    event_id: str, method: str, namespace: list[str], data: Any, stamp: int | None = None
) -> Event:
    return {
        "type": "event",
        "event_id": event_id,
        "method": method,
        "params": {
            "namespace": namespace,
            "timestamp": stamp if stamp is not None else int(time.time() * 1000),
            "data": data,
        },
    }


# -- state payloads -------------------------------------------------------------------------

_MESSAGE_TYPES = {"human", "ai", "tool", "system", "function", "remove"}


def state_payload(value: Any) -> Any:
    """A ``values`` or ``updates`` payload as the protocol shows state: messages in its
    message shape, no ``__interrupt__`` key."""
    if isinstance(value, list):
        return [_message(v) if _is_message(v) else state_payload(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, entry in value.items():
        if key == "__interrupt__":
            continue
        if key == "messages" and isinstance(entry, list):
            out[key] = [_message(v) if _is_message(v) else v for v in entry]
        else:
            out[key] = state_payload(entry)
    return out


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and _message_type(value.get("type")) in _MESSAGE_TYPES


def _message_type(value: Any) -> str | None:
    return (
        {"assistant": "ai", "user": "human"}.get(value, value) if isinstance(value, str) else None
    )


def _message(value: dict[str, Any]) -> dict[str, Any]:
    kind = _message_type(value.get("type"))
    content = value.get("content", "")
    if isinstance(content, list):
        blocks = [
            {"type": "text", "text": b} if isinstance(b, str) else _block(b)
            for b in content
            if isinstance(b, str) or (isinstance(b, dict) and isinstance(b.get("type"), str))
        ]
        content = blocks or content
    message: dict[str, Any] = {"type": kind, "content": content}
    for name in ("id", "name"):
        if isinstance(value.get(name), str):
            message[name] = value[name]
    if isinstance(value.get("response_metadata"), dict) and value["response_metadata"]:
        message["response_metadata"] = value["response_metadata"]
    if kind == "tool":
        if isinstance(value.get("tool_call_id"), str):
            message["tool_call_id"] = value["tool_call_id"]
        if value.get("status") in ("success", "error"):
            message["status"] = value["status"]
        if "artifact" in value:
            message["artifact"] = value["artifact"]
    if kind == "ai" and isinstance(value.get("tool_calls"), list) and value["tool_calls"]:
        calls = []
        for call in value["tool_calls"]:
            if isinstance(call, dict) and isinstance(call.get("name"), str):
                entry = {"type": "tool_call", "name": call["name"], "args": call.get("args") or {}}
                if isinstance(call.get("id"), str):
                    entry["id"] = call["id"]
                calls.append(entry)
        if calls:
            message["tool_calls"] = calls
    return message


_BLOCK_TYPES = {
    "text",
    "reasoning",
    "image",
    "audio",
    "video",
    "file",
    "text-plain",
    "tool_call",
    "tool_call_chunk",
    "invalid_tool_call",
    "server_tool_call",
    "server_tool_call_chunk",
    "server_tool_result",
    "non_standard",
}


def _block(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] in _BLOCK_TYPES:
        return block
    return {"type": "non_standard", "value": dict(block)}


def replayed(run: RunRecord) -> bool:
    """Whether a run over before a connection opened is sent to it, as LangGraph's server
    keeps a run's events for later readers: only a resumable one (``stream_resumable``,
    which every run of a thread command is), or one stopped at an interrupt the thread
    still waits on. Another finished run is history: replaying its ``completed`` would
    end a new client's wait for the run it is about to start (``thread.output`` would be
    the old state)."""
    return not run.done or run.status == "interrupted" or bool(run.kwargs.get("stream_resumable"))


# -- reading a thread --------------------------------------------------------------------------


async def run_events(svc: Services, run: RunRecord, graph_name: str) -> AsyncIterator[Event | None]:
    """The run's protocol events from its start (``None``: a heartbeat's pause while it
    logs nothing).

    Raises:
        FollowerDropped: the relay stopped feeding this reader.
    """
    events = RunEvents(run, graph_name)
    yield events.lifecycle("running")
    status = run.status
    if run.done and await svc.runs.events.last(run.run_id) is None:
        # Finished, and its log is gone (expired): nothing to wait for.
        for event in events.end(status):
            yield event
        return
    # A follower the relay drops (it fell behind) ends the connection abruptly
    # (FollowerDropped goes up): the client reconnects with ``since`` and resumes there.
    async with svc.runs.relay.follow(run.run_id, "0-0") as follower:
        while True:
            entry = await follower.next(timeout=HEARTBEAT)
            if entry is None:
                yield None
                try:
                    refreshed = await svc.runs.refresh(run)
                except NotFound:  # deleted meanwhile
                    break
                if refreshed.done and await _ended(svc, run):
                    status = refreshed.status
                    break
                continue
            if entry.event == END:
                status = entry.data.decode(errors="replace")
                break
            for event in events.entry(entry):
                yield event
    if status == "error":
        with contextlib.suppress(NotFound):
            events.run = await svc.runs.refresh(run)
    for event in events.end(status):
        yield event


async def _ended(svc: Services, run: RunRecord) -> bool:
    last = await svc.runs.events.last(run.run_id)
    return last is None or last.event == END
