"""LangChain's Agent Chat UI against ``toolfleet serve`` and ``langgraph dev``: the requests
the UI's page (and its ``/api`` passthrough proxy) sends, replayed over HTTP to both
servers on one project, and their answers compared.

What a browser adds is replayed as it sends it: an ``Origin`` on every request, a CORS
preflight (``OPTIONS`` with ``Access-Control-Request-Method`` and ``-Headers``) before each
request with a JSON body or an API key, and every body as ``text/plain;charset=UTF-8``
(what the proxy's ``fetch`` declares for the string it forwards). The interrupt is
approved as the UI approves it: ``{"input": {}, "command": {"resume": ...}}``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk.sse import SSEDecoder

from tests.support.api_pair import THREAD_GAPS, ApiPair, api_pair, drop
from tests.support.fleet import REPO
from tests.support.parity import normalise, shape
from tests.support.serving import ServerProcess, prefork_fleet
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(300)

PROJECT = REPO / "tests" / "thread_project" / "langgraph.json"
"""Its ``approval`` graph stops for a human's answer, as a HITL agent in the UI does."""

UI = "http://localhost:3000"
"""The origin of the UI's page (``pnpm dev``'s)."""

TEXT = "text/plain;charset=UTF-8"
STREAM_MODES = ["values", "messages-tuple", "updates", "custom"]


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    """toolfleet with the UI's origin allowed (``TOOLFLEET_CORS_ORIGINS``) beside
    ``langgraph dev`` (which allows any origin)."""
    token = f"tft-ui-{uuid.uuid4().hex}"
    yield from api_pair(prefork_fleet, tmp_path_factory, (token,), PROJECT, cors_origins=(UI,))


class Page:
    """What the UI's page sends to one server, recorded step by step."""

    def __init__(self, server: ServerProcess, api_key: str | None) -> None:
        self.http = httpx.Client(base_url=server.url, timeout=60.0)
        self.key = {"x-api-key": api_key} if api_key else {}
        self.steps: dict[str, dict[str, Any]] = {}

    def preflight(self, name: str, path: str, method: str) -> None:
        answer = self.http.options(
            path,
            headers={
                "Origin": UI,
                "Access-Control-Request-Method": method,
                "Access-Control-Request-Headers": "content-type,x-api-key",
            },
        )
        allowed = answer.headers.get("access-control-allow-origin")
        self.steps[name] = {
            "status": answer.status_code,
            "origin_allowed": allowed in (UI, "*"),
            "method_allowed": method in answer.headers.get("access-control-allow-methods", ""),
            "headers_allowed": all(
                h in answer.headers.get("access-control-allow-headers", "").lower()
                for h in ("content-type", "x-api-key")
            ),
        }

    def call(self, name: str, method: str, path: str, body: Any = None) -> Any:
        self.preflight(f"{name} (preflight)", path, method)
        answer = self.http.request(
            method,
            path,
            content=None if body is None else json.dumps(body),
            headers={"Origin": UI, "Content-Type": TEXT, **self.key},
        )
        parsed = answer.json() if answer.content else None
        if isinstance(parsed, dict) and "thread_id" in parsed:
            parsed = drop(parsed, *THREAD_GAPS)  # known, set aside by every parity test
        self.steps[name] = {
            "status": answer.status_code,
            "readable": answer.headers.get("access-control-allow-origin") in (UI, "*"),
            "body": parsed,
        }
        return parsed

    def stream(self, name: str, path: str, body: Any) -> list[tuple[str, Any]]:
        self.preflight(f"{name} (preflight)", path, "POST")
        decoder = SSEDecoder()
        events: list[tuple[str, Any]] = []
        with self.http.stream(
            "POST",
            path,
            content=json.dumps(body),
            headers={"Origin": UI, "Content-Type": TEXT, **self.key},
        ) as answer:
            for line in answer.iter_lines():
                part = decoder.decode(line.rstrip("\n").encode())
                if part is not None:
                    events.append((part.event, part.data))
            self.steps[name] = {
                "status": answer.status_code,
                "readable": answer.headers.get("access-control-allow-origin") in (UI, "*"),
                "events": [event for event, _ in events],
            }
        return events


def replay(server: ServerProcess, api_key: str | None) -> dict[str, dict[str, Any]]:
    """The UI's requests for one conversation with an interrupt, as it sends them."""
    page = Page(server, api_key)
    try:
        page.call("info", "GET", "/info")
        page.call("search", "POST", "/threads/search", {"limit": 100, "offset": 0})
        thread = page.call("create thread", "POST", "/threads", {"metadata": {}})
        tid = thread["thread_id"]
        run = {
            "assistant_id": "approval",
            "stream_mode": STREAM_MODES,
            "stream_subgraphs": True,
            "stream_resumable": True,
            "on_disconnect": "continue",
        }
        asked = page.stream(
            "run", f"/threads/{tid}/runs/stream", {**run, "input": {"request": "deploy"}}
        )
        page.steps["run"]["interrupt"] = any(
            event == "values" and "__interrupt__" in data for event, data in asked
        )
        page.call("state", "GET", f"/threads/{tid}/state")
        answered = page.stream(
            "approve",
            f"/threads/{tid}/runs/stream",
            {**run, "input": {}, "command": {"resume": "yes"}},
        )
        values = [data for event, data in answered if event == "values"]
        page.steps["approve"]["done"] = bool(values) and values[-1].get("done")
        page.call("history", "POST", f"/threads/{tid}/history", {"limit": 1000})
        page.call("thread", "GET", f"/threads/{tid}")
        page.call("search again", "POST", "/threads/search", {"limit": 100, "offset": 0})
    finally:
        page.http.close()
    return page.steps


def test_the_ui_conversation_with_an_interrupt_gets_the_same_answers(pair: ApiPair) -> None:
    """Given both servers on the approval project, when the UI's requests for a
    conversation are replayed (preflights, text/plain bodies, a thread made, a streamed
    run that stops for approval, the approval as ``input: {}`` beside a command, the
    history), then every preflight allows the UI's origin, method and headers, every
    answer is readable by the page, and the two servers answer alike: the same statuses,
    bodies of the same shape, the same stream events, the run done after the approval."""
    ours = replay(pair.toolfleet, pair.toolfleet.settings.api_tokens[0])
    theirs = replay(pair.langgraph, None)

    assert list(ours) == list(theirs)
    for name, step in ours.items():
        if name.endswith("(preflight)"):
            assert step == {
                "status": 200,
                "origin_allowed": True,
                "method_allowed": True,
                "headers_allowed": True,
            }, (name, step)
        else:
            assert step["status"] == 200 and step["readable"], (name, step)
    assert ours["run"]["interrupt"] and theirs["run"]["interrupt"]
    assert ours["approve"]["done"] is True and theirs["approve"]["done"] is True
    differences = [
        f"{name}: ours {shape(normalise(ours[name]))}, langgraph {shape(normalise(theirs[name]))}"
        for name in ours
        if name not in LOOSE and shape(normalise(ours[name])) != shape(normalise(theirs[name]))
    ]
    assert not differences, "\n".join(differences)
    for name in LOOSE:
        assert ours[name]["status"] == theirs[name]["status"], name


LOOSE = ("info", "state", "history", "thread", "search again")
"""Steps compared by status only: what each server says of itself (``/info``), and the
thread fields the parity tests already set aside (toolfleet's ``interrupts`` map on every
thread; checkpoint metadata of LangGraph's platform)."""
