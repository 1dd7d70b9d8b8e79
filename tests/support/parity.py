"""The Agent Protocol oracle: one ``langgraph-sdk`` scenario against two servers, compared.

A scenario is a list of :class:`Step` s, each one SDK call (``"threads.create"``,
``"runs.stream"``, ...) with its arguments. An argument may be a :class:`Ref` to a value an
earlier step returned (``Ref("thread", "thread_id")``), resolved against the same server's
answers, so each server runs the scenario on its own threads and runs.

Each step is recorded as an :class:`Outcome`: the HTTP status (200 for a success, the
error's status otherwise), the response body, and for a stream the SSE events in order.
Two recordings are compared by *shape*: ids, timestamps and other run-specific values are
normalised away, scalars become their type names, dicts keep their keys and lists their
elements; the values of a few protocol keys (a thread's or run's ``status``, a stream's
event names) are kept, because they are the behaviour. :func:`compare` returns one line
per difference, naming the step and the path where the two servers disagree, so a failing
assertion reads as a diff.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph_sdk import get_client
from langgraph_sdk.errors import APIStatusError

UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}")

KEPT = frozenset({"status", "multitask_strategy", "graph_id", "next"})
"""Keys whose values (not only their types) are protocol behaviour, compared as is."""

PLATFORM = (
    ".langgraph_host:",
    ".langgraph_plan:",
    ".langgraph_version:",
    ".langgraph_api_version:",
    ".langgraph_api_url:",
    ".langgraph_request_id:",
    ".langgraph_auth_user",
    ".user_id:",
    ".created_by:",
)
"""Differences every comparison leaves out: what LangGraph's platform records of its own
deployment (host, plan, versions, request and auth-user ids) in metadata and config."""

UNTIL_TIMEOUT = 60.0
"""Longest wait of a step's ``until``."""

STREAM_CALLS = frozenset({"runs.stream", "runs.join_stream", "threads.join_stream"})


@dataclass(frozen=True)
class Ref:
    """The value at ``path`` in what step ``step`` returned (on the same server)."""

    step: str
    path: tuple[str | int, ...] = ()

    def __init__(self, step: str, *path: str | int) -> None:
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "path", path)

    def resolve(self, saved: dict[str, Any]) -> Any:
        value = saved[self.step]
        for key in self.path:
            # A stream's parts are ``StreamPart`` tuples: ``Ref("s", 2, "id")``.
            is_field = isinstance(key, str) and not isinstance(value, dict)
            value = getattr(value, key) if is_field else value[key]
        return value


@dataclass(frozen=True)
class Step:
    """One SDK call of a scenario.

    Args:
        name: The step's label, and the name later steps' :class:`Ref` s use.
        call: The SDK method, as ``"<resource>.<method>"`` of the async client.
        kwargs: Its keyword arguments (:class:`Ref` s anywhere inside are resolved).
        args: Its positional arguments (likewise).
        note: What the step checks, printed with its differences.
        until: Repeat the call (every 0.1 s, for at most 60 s) until this holds of its
            answer: a wait on the state the next step needs, never a fixed sleep.
    """

    name: str
    call: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()
    note: str = ""
    until: Callable[[Any], bool] | None = None
    kinds_only: bool = False
    """For a stream: compare only which events came (their names, once each), not their
    order or count: where the oracle's own answer varies (LangGraph's in-memory server
    gives every event of a millisecond one id, so a reconnect after one skips the rest)."""


@dataclass
class Outcome:
    """What one server answered to one step."""

    status: int
    body: Any = None
    events: list[tuple[str, Any]] | None = None

    def describe(self, kinds_only: bool = False) -> dict[str, Any]:
        """The outcome as one value (what :func:`shape` is taken of)."""
        recorded: dict[str, Any] = {"status": self.status}
        if self.events is not None and kinds_only:
            recorded["events"] = sorted({event for event, _ in self.events})
        elif self.events is not None:
            recorded["events"] = [event for event, _ in self.events]
            recorded["data"] = [data for _, data in self.events]
        else:
            recorded["body"] = self.body
        return recorded


Recording = list[tuple[Step, Outcome]]


def _resolve(value: Any, saved: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        return value.resolve(saved)
    if isinstance(value, dict):
        return {k: _resolve(v, saved) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_resolve(v, saved) for v in value)
    return value


async def record(url: str, scenario: Sequence[Step], api_key: str | None = None) -> Recording:
    """Run ``scenario`` against the server at ``url``; every step's outcome, in order.

    A step that fails with an HTTP error is recorded with its status and body, and the
    scenario goes on (a later step depending on its result fails in turn).
    """
    saved: dict[str, Any] = {}
    recording: Recording = []
    async with get_client(url=url, api_key=api_key) as client:
        for step in scenario:
            resource, method = step.call.split(".")
            function: Callable[..., Any] = getattr(getattr(client, resource), method)
            args = _resolve(step.args, saved)
            kwargs = _resolve(step.kwargs, saved)
            try:
                if step.call in STREAM_CALLS:
                    parts = [p async for p in function(*args, **kwargs)]
                    outcome = Outcome(200, events=[(p.event, p.data) for p in parts])
                    saved[step.name] = parts
                else:
                    body = await function(*args, **kwargs)
                    deadline = time.monotonic() + UNTIL_TIMEOUT
                    while step.until is not None and not step.until(body):
                        if time.monotonic() > deadline:
                            raise AssertionError(f"step {step.name}: never held: {body!r}")
                        await asyncio.sleep(0.1)
                        body = await function(*args, **kwargs)
                    outcome = Outcome(200, body=body)
                    saved[step.name] = body
            except APIStatusError as error:
                outcome = Outcome(error.status_code, body=error.body)
            recording.append((step, outcome))
    return recording


def normalise(value: Any) -> Any:
    """``value`` with ids (also inside strings) and timestamps replaced by placeholders
    (in keys too)."""
    if isinstance(value, dict):
        return {normalise(k): normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, str):
        if TIMESTAMP.match(value):
            return "<timestamp>"
        return UUID.sub("<id>", value)  # also inside: "lc_run--<id>-0"
    return value


def shape(value: Any, key: str | None = None) -> Any:
    """The shape of a normalised value: dicts by keys, lists by elements, scalars by type
    name, except the values of :data:`KEPT` keys and of a recording's ``events``."""
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if key in KEPT or key == "events":
            return value
        return [shape(v) for v in value]
    if key in KEPT:
        return value
    if value is None:
        return None
    return type(value).__name__


def _diff(ours: Any, theirs: Any, path: str, out: list[str]) -> None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for k in theirs.keys() - ours.keys():
            out.append(f"{path}.{k}: only langgraph has it ({_brief(theirs[k])})")
        for k in ours.keys() - theirs.keys():
            out.append(f"{path}.{k}: only ours has it ({_brief(ours[k])})")
        for k in sorted(ours.keys() & theirs.keys(), key=str):
            _diff(ours[k], theirs[k], f"{path}.{k}", out)
    elif isinstance(ours, list) and isinstance(theirs, list) and path.endswith(".events"):
        if ours != theirs:
            out.append(f"{path}: ours {ours}\n{' ' * len(path)}  langgraph {theirs}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            out.append(f"{path}: ours has {len(ours)} items, langgraph {len(theirs)}")
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            _diff(a, b, f"{path}[{i}]", out)
    elif ours != theirs:
        out.append(f"{path}: ours {_brief(ours)}, langgraph {_brief(theirs)}")


def _brief(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare(ours: Recording, theirs: Recording, allowed: Iterable[str] = ()) -> list[str]:
    """The differences between two recordings of one scenario, one readable line each
    (``step <name> (<call>) <path>: ...``), leaving out those whose line contains one of
    ``allowed``'s strings (differences known and accepted, each named by its caller) or of
    :data:`PLATFORM`."""
    known = (*PLATFORM, *allowed)
    lines: list[str] = []
    for (step, a), (_, b) in zip(ours, theirs, strict=True):
        found: list[str] = []
        mine, other = a.describe(step.kinds_only), b.describe(step.kinds_only)
        if mine.get("events") != other.get("events"):  # the data then differs throughout
            mine.pop("data", None)
            other.pop("data", None)
        _diff(
            shape(normalise(mine)),
            shape(normalise(other)),
            f"step {step.name} ({step.call})",
            found,
        )
        kept = [line for line in found if not any(k in line for k in known)]
        if kept and step.note:
            kept.insert(0, f"step {step.name}: {step.note}")
        lines.extend(kept)
    return lines


def report(differences: Sequence[str]) -> str:
    """The differences as an assertion message."""
    return "ours and langgraph dev differ:\n  " + "\n  ".join(differences)
