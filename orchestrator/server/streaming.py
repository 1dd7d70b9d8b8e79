"""A run's stream parts as a server-sent-event response, from whichever replica.

The response opens with ``event: metadata`` (``{"run_id": ..., "attempt": 1}``, 2 and on
for a run taken over from a replica that went away; not on a reconnect, which has it),
then one event per stream part: ``event: values|updates|messages|custom|...``
(``|<namespace>`` for subgraphs; ``messages/partial`` and the like for the older
messages form) with the part as JSON ``data`` and its log
entry as ``id``, then ``event: error`` if the run failed. It closes after the run's last
part. A ``Location`` header names the run's stream: the SDK reconnects there, with
``Last-Event-ID``, if the connection drops, and picks up where it left off, on any
replica.

A client that goes away stops only its own response: the run goes on, unless the client
asked to cancel on disconnect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any
from urllib.parse import quote

from fastapi.responses import StreamingResponse

from orchestrator.server.encoding import SSE_HEARTBEAT, dumps, sse_frame
from orchestrator.server.errors import Unsupported
from orchestrator.server.eventlog import END, FollowerDropped, parse_id
from orchestrator.server.records import RunRecord
from orchestrator.server.runner import RunManager

_PATH_SAFE = ":@!$&'()*+,;=-._~"
"""Characters a path segment carries as they are (RFC 3986's ``pchar``)."""

HEARTBEAT = 15.0
"""Seconds of silence after which a comment line keeps the connection open."""


def event_id(last_event_id: str) -> str:
    """A ``Last-Event-ID`` a stream resumes after, checked to be an event id of this
    server (``<ms>-<seq>``).

    Raises:
        Unsupported: it is not one (a 422: resuming from the start instead would replay
            parts the client already has).
    """
    try:
        parse_id(last_event_id)
    except ValueError:
        raise Unsupported("Last-Event-ID is not an event id of this server") from None
    return last_event_id


class HeldStreamingResponse(StreamingResponse):
    """A streaming response that calls ``release`` when it ends, however it ends (the
    body's end, the client leaving, an error): a stream slot is given back."""

    def __init__(self, content: Any, *, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Send the response, then release."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


def event_filter(stream_mode: Iterable[str] | None) -> frozenset[str] | None:
    """Event names a client asked for (``messages-tuple`` is sent as ``messages``)."""
    modes = [m for m in stream_mode or () if m]
    if not modes:
        return None
    return frozenset("messages" if m == "messages-tuple" else m for m in modes)


def run_locations(run: RunRecord, then: str = "stream") -> dict[str, str]:
    """``Content-Location`` of the run (the SDK reads the run id from it) and
    ``Location`` of its ``stream`` (or ``join``): where the SDK reconnects.

    The thread id is the client's: percent-encoded, a header can carry any of them.
    """
    path = f"/threads/{quote(run.thread_id, safe=_PATH_SAFE)}/runs/{run.run_id}"
    return {"Content-Location": path, "Location": f"{path}/{then}"}


def sse_response(
    runs: RunManager,
    run: RunRecord,
    *,
    events: frozenset[str] | None,
    after: str = "0-0",
    cancel_on_disconnect: bool = False,
    metadata: bool = True,
    release: Callable[[], None] | None = None,
) -> StreamingResponse:
    """Stream the run's parts (those named in ``events``; all for ``None``), opening with
    its ``metadata`` event unless ``metadata`` is false (a reconnecting client has it);
    ``release`` is called when the response ends."""
    headers = {
        **run_locations(run),
        "Cache-Control": "no-store",
        "X-Accel-Buffering": "no",  # nginx: pass events through as they come
    }
    body = _frames(runs, run, events, after, cancel_on_disconnect, metadata)
    if release is not None:
        return HeldStreamingResponse(
            body, release=release, media_type="text/event-stream", headers=headers
        )
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


async def _frames(
    runs: RunManager,
    run: RunRecord,
    events: frozenset[str] | None,
    after: str,
    cancel_on_disconnect: bool,
    metadata: bool,
) -> AsyncIterator[bytes]:
    if metadata:
        yield sse_frame("metadata", dumps({"run_id": run.run_id, "attempt": run.attempt}))
    ended = False
    try:
        async with runs.relay.follow(run.run_id, after) as follower:
            while True:
                try:
                    entry = await follower.next(timeout=HEARTBEAT)
                except FollowerDropped:
                    return  # the client reconnects with Last-Event-ID
                if entry is None:
                    yield SSE_HEARTBEAT
                    # Ends a run without a lease whose replica died (runlookup).
                    await runs.get_run(run.tenant, run.thread_id, run.run_id)
                    continue
                if entry.event == END:
                    ended = True
                    return
                if events is None or entry.event == "error" or _base(entry.event) in events:
                    yield sse_frame(entry.event, entry.data, entry.id)
    finally:
        if cancel_on_disconnect and not ended:
            runs.cancel_soon(run)


def _base(event: str) -> str:
    """The stream mode of an event: ``messages`` for the ``messages/partial`` of its older
    form, ``values`` for ``values|<namespace>``."""
    return event.partition("|")[0].partition("/")[0]
