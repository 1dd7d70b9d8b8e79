"""What a run's graph streams, as the protocol's stream events, in LangGraph's server's forms.

``graph.astream`` runs with the modes the client asked for (plus ``custom``, which carries
the fleet's tool-call events and is always recorded), and each part becomes one event:

- ``messages-tuple``: ``messages`` events, ``[message chunk, metadata]`` per token;
- ``messages`` (the older form): ``messages/metadata`` (``{id: {"metadata": ...}}``) the
  first time a message is seen, then ``messages/partial`` with the message so far (as a
  whole message) for every chunk (``messages/complete`` for a whole message), each a
  one-item list;
- ``debug``: its checkpoint payloads also carry ``checkpoint`` and ``parent_checkpoint``
  (the configs as checkpoints) and each task its ``checkpoint``;
- ``events``: the run goes through ``graph.astream_events`` (v2) instead; the graph's own
  stream parts come out as above, every other callback event as an ``events`` event;
- any other mode: its part as it is (``mode|<namespace>`` for subgraphs).

A run started by a thread command (:class:`ProtocolRun`, ``POST /threads/{id}/commands``)
goes through ``graph.astream_events`` (``version="v3"``) instead, as on LangGraph's server:
each of its events is recorded whole (``{"type": "event", "method", "params"}``), named
``method|<namespace>``; :mod:`orchestrator.server.threadevents` numbers and filters them.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterable
from typing import Any

from langchain_core.messages import BaseMessage, BaseMessageChunk, message_chunk_to_message
from langgraph.types import Command

from orchestrator.server.encoding import checkpoint_of
from orchestrator.server.schemas import RunCreate


class ProtocolRun(RunCreate):
    """A run a thread command started: recorded as the thread-centric protocol's events.

    Never a request body of its own: the command route builds it from ``run.start`` or
    ``input.respond``, after which it is a run like any other (record, queue, log)."""


PROTOCOL_OPTIONS = ("interrupt_before", "interrupt_after", "durability", "context")
"""Run fields passed on to the protocol's stream (it chooses its own modes)."""

GRAPH_MODES = {"messages-tuple": "messages", "events": None}
"""The graph stream mode behind a requested one (``None``: none, ``events`` is not one)."""


def recorded_modes(requested: Iterable[str]) -> list[str]:
    """Stream modes a run records: those asked for, plus ``custom`` (tool-call events)."""
    modes = list(dict.fromkeys(requested))
    if "custom" not in modes:
        modes.append("custom")
    return modes


class RunStream:
    """The events of one run.

    Args:
        body: The run's request (modes, subgraphs, interrupts, durability, context).
        thread_id: The thread id the client knows, shown in debug checkpoints.
    """

    def __init__(self, body: RunCreate, thread_id: str) -> None:
        self.body = body
        self.thread_id = thread_id
        self.requested = recorded_modes(body.stream_mode)
        graph_modes = (GRAPH_MODES.get(m, m) for m in self.requested)
        self.graph_modes = list(dict.fromkeys(m for m in graph_modes if m))
        self._messages: dict[str, BaseMessage] = {}

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "stream_mode": self.graph_modes,
            "subgraphs": self.body.stream_subgraphs,
        }
        for name in ("interrupt_before", "interrupt_after", "durability", "context"):
            if (value := getattr(self.body, name)) is not None:
                options[name] = value
        # Each step saved before the next begins, unless the run asks otherwise: the tool
        # calls a model step made are published only once that step is in the
        # checkpoint, so a run taken over by another replica never makes them again
        # under new ids (see runlease).
        options.setdefault("durability", "sync")
        return options

    def _payload(self) -> Any:
        if self.body.command is not None:
            return Command(**self.body.command.model_dump(exclude_none=True))
        return self.body.input

    async def events(self, graph: Any, config: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
        """Run the graph; yield ``(event name, data)`` as it streams."""
        if isinstance(self.body, ProtocolRun):
            async for event in self._protocol_events(graph, config):
                yield event
            return
        if "events" not in self.requested:
            async for item in graph.astream(self._payload(), config, **self._options()):
                for event in self._part(item):
                    yield event
            return
        root = str(config["run_id"])
        async for raw in graph.astream_events(
            self._payload(), config, version="v2", **self._options()
        ):
            if "langsmith:hidden" in (raw.get("tags") or ()):
                continue
            if raw["event"] == "on_chain_stream" and raw["run_id"] == root:
                for event in self._part(raw["data"]["chunk"]):
                    yield event
            else:
                yield "events", raw

    async def _protocol_events(
        self, graph: Any, config: dict[str, Any]
    ) -> AsyncIterator[tuple[str, Any]]:
        options = {
            name: value
            for name in PROTOCOL_OPTIONS
            if (value := getattr(self.body, name)) is not None
        }
        with warnings.catch_warnings():  # langgraph marks the v3 stream experimental
            warnings.simplefilter("ignore")
            stream = await graph.astream_events(self._payload(), config, version="v3", **options)
        async with stream:
            async for event in stream:
                if not isinstance(event, dict):
                    continue
                params = event.get("params") or {}
                namespace = [str(n) for n in params.get("namespace") or ()]
                yield "|".join([str(event.get("method", "")), *namespace]), event

    def _part(self, item: Any) -> Iterable[tuple[str, Any]]:
        namespace: tuple[str, ...] = ()
        if self.body.stream_subgraphs:
            namespace, mode, chunk = item
        else:
            mode, chunk = item

        def named(event: str) -> str:
            return "|".join([event, *namespace])

        if mode == "messages" and "messages-tuple" not in self.requested:
            return [(named(e), data) for e, data in self._legacy_messages(chunk)]
        if mode == "debug" and isinstance(chunk, dict) and chunk.get("type") == "checkpoint":
            chunk = {**chunk, "payload": self._debug_checkpoint(chunk["payload"])}
        return [(named(mode), chunk)]

    def _legacy_messages(self, chunk: Any) -> list[tuple[str, Any]]:
        message, metadata = chunk
        out: list[tuple[str, Any]] = []
        if message.id in self._messages:
            self._messages[message.id] = self._messages[message.id] + message
        else:
            self._messages[message.id] = message
            out.append(("messages/metadata", {message.id: {"metadata": metadata}}))
        # The message so far, as a whole message (no chunk fields), as LangGraph's does.
        name = "messages/partial" if isinstance(message, BaseMessageChunk) else "messages/complete"
        out.append((name, [message_chunk_to_message(self._messages[message.id])]))
        return out

    def _debug_checkpoint(self, payload: Any) -> Any:
        if not payload:
            return None
        tasks = []
        for task in payload.get("tasks", ()):
            state = task.get("state")
            if isinstance(state, dict) and state.get("configurable"):
                task = {k: v for k, v in task.items() if k != "state"}
                task["checkpoint"] = state["configurable"]
            tasks.append(task)
        # The run's tenant in its configs is dropped as the event is recorded
        # (:mod:`orchestrator.server.guards.clientview`), with every other mode's.
        return {
            **payload,
            "checkpoint": checkpoint_of(payload.get("config"), self.thread_id),
            "parent_checkpoint": checkpoint_of(payload.get("parent_config"), self.thread_id),
            "tasks": tasks,
        }
