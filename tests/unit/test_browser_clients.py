"""What a browser client (LangChain's Agent Chat UI) needs of the HTTP service before any
handler runs: CORS preflights answered as configured, JSON bodies read as JSON whatever
text type the browser declared, and a resume sent with an empty input beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.server import create_app
from orchestrator.server.cors import CorsPolicy, cors_policy
from orchestrator.server.projects import read_project
from orchestrator.server.schemas import RunCreate
from tool_workers.contract.settings import Settings

TOKEN = "unit-token"
UI = "http://localhost:3000"

CORS_HEADERS = frozenset(
    {
        "access-control-allow-origin",
        "access-control-allow-methods",
        "access-control-allow-headers",
        "access-control-allow-credentials",
        "access-control-max-age",
        "vary",
    }
)
"""What a preflight's answer may carry besides the plain body Starlette gives it."""


def client(settings: Settings, cors: CorsPolicy | None = None) -> TestClient:
    app = create_app(settings, cors=cors)
    app.state.services = None  # no lifespan: only what runs before the handlers is reached
    app.state.auth.bind(b"unit-key")
    return TestClient(app)


def preflight(http: TestClient, path: str, origin: str = UI, method: str = "POST") -> Any:
    return http.options(
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "content-type,x-api-key",
        },
    )


def test_without_cors_settings_a_browser_is_refused() -> None:
    """Given no CORS setting, when a browser sends a preflight, then no origin is allowed
    (the default stays closed to pages of other origins)."""
    http = client(Settings(api_tokens=(TOKEN,)))

    for path in ("/threads/search", "/threads", "/info"):
        answer = preflight(http, path)
        assert "access-control-allow-origin" not in answer.headers, (path, answer.headers)


def test_cors_origins_setting_answers_preflights_before_auth_with_cors_headers_only() -> None:
    """Given TOOLFLEET_CORS_ORIGINS naming the UI's origin, when the UI sends preflights
    (which carry no token), then each is a 200 allowing that origin, the method and the
    headers asked for, and says nothing else; another origin is not allowed; a real
    request from the UI gets the origin on its answer, its 401 too."""
    settings = Settings(api_tokens=(TOKEN,), cors_origins=f"{UI}, http://127.0.0.1:3000")
    assert settings.cors_origins == (UI, "http://127.0.0.1:3000")
    http = client(settings)

    for path in ("/threads/search", "/threads", "/info", "/threads/t/runs/stream"):
        answer = preflight(http, path)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["access-control-allow-origin"] == UI
        assert "POST" in answer.headers["access-control-allow-methods"]
        allowed = answer.headers["access-control-allow-headers"].lower()
        assert "x-api-key" in allowed and "content-type" in allowed
        extra = set(answer.headers) - CORS_HEADERS - {"content-length", "content-type"}
        assert not extra, extra
        assert TOKEN not in answer.text
    refused = preflight(http, "/threads", origin="https://elsewhere.example")
    assert refused.headers.get("access-control-allow-origin") != "https://elsewhere.example"

    unauthorized = http.post("/threads/search", json={}, headers={"Origin": UI})
    assert unauthorized.status_code == 401
    assert unauthorized.headers["access-control-allow-origin"] == UI
    listed = http.get("/ok", headers={"Origin": UI})
    assert listed.headers["access-control-allow-origin"] == UI


def test_project_http_cors_is_read_as_langgraph_documents_it(tmp_path: Path) -> None:
    """Given a langgraph.json with ``http.cors``, when it is read, then every documented
    field is taken, and the server answers preflights as it says; without
    ``allow_origins`` there, TOOLFLEET_CORS_ORIGINS gives them (as LangGraph's
    CORS_ALLOW_ORIGINS does)."""
    cors = {
        "allow_origins": [UI],
        "allow_methods": ["GET", "POST"],
        "allow_headers": ["content-type", "x-api-key"],
        "allow_credentials": True,
        "expose_headers": ["x-pagination-total"],
        "max_age": 120,
    }
    (tmp_path / "graph.py").write_text("graph = None\n")
    project_file = tmp_path / "langgraph.json"
    project_file.write_text(
        json.dumps({"graphs": {"g": "./graph.py:graph"}, "http": {"cors": cors}})
    )
    project = read_project(project_file)
    assert project.cors is not None
    policy = cors_policy(Settings(), project.cors)
    assert policy is not None and policy.allow_origins == (UI,)
    http = client(Settings(api_tokens=(TOKEN,)), policy)

    answer = preflight(http, "/threads")
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == UI
    assert answer.headers["access-control-allow-credentials"] == "true"
    assert answer.headers["access-control-max-age"] == "120"
    assert "DELETE" not in answer.headers["access-control-allow-methods"]
    exposed = http.get("/ok", headers={"Origin": UI}).headers
    assert exposed["access-control-expose-headers"] == "x-pagination-total"

    from_setting = cors_policy(
        Settings(cors_origins="http://a.example"),
        read_project(project_file).cors.model_copy(update={"allow_origins": None}),
    )
    assert from_setting is not None and from_setting.allow_origins == ("http://a.example",)
    assert cors_policy(Settings(), None) is None


@pytest.mark.parametrize("content_type", ["text/plain;charset=UTF-8", None, "text/plain"])
def test_a_json_body_is_read_as_json_whatever_text_type_it_declares(
    content_type: str | None,
) -> None:
    """Given a body of JSON sent as ``text/plain`` (what the UI's proxy sends) or with no
    type, when it reaches a route, then it is read as JSON: the answer is the route's own
    (here the 422 naming the missing field), not a refusal of the body's type."""
    http = client(Settings(api_tokens=(TOKEN,)))
    headers = {"X-Api-Key": TOKEN}
    if content_type is not None:
        headers["Content-Type"] = content_type

    answer = http.post(
        "/threads/t/runs", content=json.dumps({"stream_mode": "values"}), headers=headers
    )

    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == "assistant_id: Field required"


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_a_body_of_another_media_type_is_a_415(content_type: str) -> None:
    """Given a body declared as a form, when it reaches the service, then it is refused
    with 415 naming the type to send, before any route reads it."""
    http = client(Settings(api_tokens=(TOKEN,)))

    answer = http.post(
        "/threads/t/runs",
        content=b'{"assistant_id": "agent"}',
        headers={"X-Api-Key": TOKEN, "Content-Type": content_type},
    )

    assert answer.status_code == 415, answer.text
    assert "application/json" in answer.json()["detail"]


def test_an_empty_input_beside_a_command_is_no_input() -> None:
    """Given a run body with ``input: {}`` and a command (how the UI resumes an
    interrupt), when it is read, then it is a resume without input; an input with
    content beside a command is kept, for the run's own refusal (422)."""
    body = RunCreate.model_validate(
        {"assistant_id": "agent", "input": {}, "command": {"resume": {"decisions": []}}}
    )
    assert body.input is None and body.command is not None
    assert RunCreate.model_validate({"assistant_id": "agent", "input": {}}).input == {}
    both = RunCreate.model_validate(
        {"assistant_id": "agent", "input": {"messages": []}, "command": {"resume": 1}}
    )
    assert both.input == {"messages": []} and both.command is not None
