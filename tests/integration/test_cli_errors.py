"""The ``toolfleet`` command's errors: a line or two and a non-zero exit, never a traceback.

Run as a user runs it: the installed console script (whose import path starts at its own
folder, not the working directory), in a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.local import settings_env
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)

TOOLFLEET = str(Path(sys.executable).parent / "toolfleet")
PASSWORD = "s3cret-pw"


def _closed_port() -> int:
    # A port nothing listens on: bound, then released.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toolfleet(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return subprocess.run(
        [TOOLFLEET, *args],
        cwd=cwd,
        env={**base, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def _assert_short_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    text = result.stdout + result.stderr
    assert result.returncode != 0, text
    assert "Traceback" not in text and "╭" not in text, text
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, text
    for needle in needles:
        assert needle in result.stderr, text


@pytest.mark.parametrize(
    "command", [["status"], ["run", "hello", "--wait", "1"], ["serve", "--no-auth"]]
)
def test_unreachable_broker_is_one_line_with_the_password_masked(
    tmp_path: Path, command: list[str]
) -> None:
    """Given a broker URL with a password where nothing listens, when status or run
    starts, then it prints one or two lines naming the URL with its password masked and
    exits non-zero."""
    port = _closed_port()
    result = _toolfleet(
        *command, cwd=tmp_path, TOOLFLEET_BROKER_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    )

    _assert_short_error(result, f"redis://:***@127.0.0.1:{port}/0")
    assert PASSWORD not in result.stdout + result.stderr


def _project(root: Path) -> None:
    (root / "myproj").mkdir()
    (root / "myproj" / "__init__.py").write_text("")
    (root / "myproj" / "models.py").write_text(
        "from orchestrator.sample import scripted_model\n\n\n"
        "def fn():\n    return scripted_model()\n"
    )


def test_run_finds_the_model_module_in_the_current_directory(tmp_path: Path) -> None:
    """Given a project directory holding myproj/models.py, when `toolfleet run --model
    myproj.models:fn` runs there, then the model is found: the run gets as far as the
    broker (unreachable here) and says so in a line."""
    _project(tmp_path)
    port = _closed_port()
    result = _toolfleet(
        "run",
        "hello",
        "--model",
        "myproj.models:fn",
        "--wait",
        "1",
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=f"redis://127.0.0.1:{port}/0",
    )

    _assert_short_error(result, f"127.0.0.1:{port}")
    assert "myproj" not in result.stderr


def test_run_with_a_model_that_cannot_be_imported_is_one_line(tmp_path: Path) -> None:
    """Given a model spec whose attribute does not exist, when `toolfleet run` starts,
    then it says so in a line before touching the fleet and exits non-zero."""
    _project(tmp_path)
    result = _toolfleet(
        "run",
        "hello",
        "--model",
        "myproj.models:missing",
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=f"redis://127.0.0.1:{_closed_port()}/0",
    )

    _assert_short_error(result, "myproj.models:missing")


@pytest.mark.parametrize(
    ("env", "needles", "secret"),
    [
        (
            {"TOOLFLEET_BROKER_URL": "amqp://tf:S3cret-pw@127.0.0.1:1//"},
            ["TOOLFLEET_REDIS_URL"],
            "S3cret-pw",
        ),
        ({"TOOLFLEET_BROKER_URL": "redsi://127.0.0.1:6379/0"}, ["'redsi'", "redis://"], None),
        ({"TOOLFLEET_REGISTRY_REFRESH": "soon"}, ["TOOLFLEET_REGISTRY_REFRESH"], None),
    ],
    ids=["amqp-without-redis", "unknown-scheme", "not-a-number"],
)
def test_a_settings_error_is_one_line_with_secrets_masked(
    env: dict[str, str], needles: list[str], secret: str | None, tmp_path: Path
) -> None:
    """Given settings that cannot work (a RabbitMQ broker with no Redis named, a typo in
    the scheme, a word where a number belongs), when a command starts, then it says what
    is wrong in a line or two, never the password, and exits with 2."""
    for command in (["status"], ["run", "hello"]):
        result = _toolfleet(*command, cwd=tmp_path, **env)

        _assert_short_error(result, *needles)
        assert result.returncode == 2
        if secret is not None:
            assert secret not in result.stdout + result.stderr


def test_demo_checks_its_model_before_starting_the_fleet(tmp_path: Path) -> None:
    """Given a model whose provider package is not installed, when `toolfleet demo`
    starts, then it says so in a line before anything is started."""
    result = _toolfleet("demo", "--model", "toolfleet-absent-provider:some-model", cwd=tmp_path)

    _assert_short_error(result, "toolfleet-absent-provider")
    assert "embedded server" not in result.stdout


FAILING_MODEL = """
from langchain_core.language_models.fake_chat_models import FakeListChatModel


class Unreachable(FakeListChatModel):
    def _call(self, *args, **kwargs):
        raise ConnectionError("Connection refused (api.example.invalid:443)")

    def bind_tools(self, tools, **kwargs):
        return self


def fn():
    return Unreachable(responses=["never"])
"""


def test_a_model_that_fails_is_one_line(tmp_path: Path, shared_fleet: Settings) -> None:
    """Given a fleet and a model that cannot reach its provider, when `toolfleet run`
    calls it, then it says which model failed and why in a line or two and exits with 2."""
    (tmp_path / "failing.py").write_text(FAILING_MODEL)
    result = _toolfleet(
        "run", "hello", "--model", "failing:fn", cwd=tmp_path, **settings_env(shared_fleet)
    )

    _assert_short_error(result, "failing:fn", "ConnectionError", "Connection refused")
    assert result.returncode == 2


def test_a_wait_says_what_it_waits_for_and_ctrl_c_exits_130(tmp_path: Path, redis_url: str) -> None:
    """Given a fleet with no worker, when `toolfleet run` waits for one, then within a
    few seconds it says what it waits for and for how long; Ctrl-C then ends it with
    exit code 130 and no traceback."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    process = subprocess.Popen(
        [TOOLFLEET, "run", "hello", "--wait", "30"],
        cwd=tmp_path,
        env={
            **base,
            "COLUMNS": "200",
            "TOOLFLEET_BROKER_URL": redis_url,
            "TOOLFLEET_NAMESPACE": f"tft-wait-{os.getpid()}",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # SIGINT handled as in a terminal's foreground job, whatever this runner's own
        # disposition (a job started in the background of a script has it ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    said = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "waiting up to 30 s for workers" in line:
                said.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # A generous bound on a loaded machine: the line comes as the wait begins.
        said.wait(timeout=60)
        process.send_signal(signal.SIGINT)  # as Ctrl-C sends it
        process.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
    out, err = "".join(lines), ""

    assert "waiting up to 30 s for workers" in out + err, out + err
    assert process.returncode == 130, out + err
    assert "Traceback" not in out + err


BAD_PORT = f"redis://:{PASSWORD}@127.0.0.1:63x1/0"
"""A broker URL whose port is no number (a typo a user makes)."""


@pytest.mark.parametrize("command", [["status"], ["serve", "--no-auth"]])
def test_a_broker_url_with_a_malformed_port_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """Given a broker URL whose port is not a number, when a command starts, then it
    names the setting and the port in a line, never the password, and exits with 2."""
    result = _toolfleet(*command, cwd=tmp_path, TOOLFLEET_BROKER_URL=BAD_PORT)

    _assert_short_error(result, "TOOLFLEET_BROKER_URL", "63x1")
    assert result.returncode == 2
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("model", "needle"),
    [("nosuchmod:thing", "nosuchmod"), ("openai:gpt-4o-mini", "langchain-openai")],
    ids=["unknown-provider", "provider-not-installed"],
)
def test_serve_with_a_model_that_cannot_be_made_is_one_line(
    tmp_path: Path, model: str, needle: str
) -> None:
    """Given a model spec that leads to no chat model, when `toolfleet serve` starts,
    then it says so in a line before connecting anywhere, as `toolfleet run` does."""
    result = _toolfleet(
        "serve",
        "--no-auth",
        cwd=tmp_path,
        TOOLFLEET_MODEL=model,
        TOOLFLEET_BROKER_URL=f"redis://127.0.0.1:{_closed_port()}/0",
    )

    _assert_short_error(result, needle)
    assert result.returncode == 2


def test_serve_on_a_port_in_use_is_one_line_and_exits(tmp_path: Path, redis_url: str) -> None:
    """Given a port another process listens on, when `toolfleet serve` is asked to listen
    there, then it says so in a line and exits with 2 before it starts anything."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _toolfleet(
            "serve",
            "--no-auth",
            "--port",
            str(port),
            cwd=tmp_path,
            TOOLFLEET_BROKER_URL=redis_url,
            TOOLFLEET_NAMESPACE=f"tft-port-{os.getpid()}",
            TOOLFLEET_CHECKPOINT_PATH=str(tmp_path / "checkpoints.sqlite"),
        )

    _assert_short_error(result, f"127.0.0.1:{port}", "in use")
    assert result.returncode == 2
    assert "Application startup" not in result.stdout + result.stderr


def test_serve_with_a_database_that_does_not_answer_is_one_line(
    tmp_path: Path, redis_url: str
) -> None:
    """Given a checkpointer database nothing answers at, when `toolfleet serve` starts,
    then it names the database (password masked) in a line and exits with 2 within
    seconds, not after the connection pool's 30 s of retries."""
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{_closed_port()}/test"
    result = _toolfleet(
        "serve",
        "--no-auth",
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=redis_url,
        TOOLFLEET_NAMESPACE=f"tft-db-{os.getpid()}",
        TOOLFLEET_DATABASE_URL=url,
    )

    _assert_short_error(result, "cannot reach the database", "127.0.0.1")
    assert result.returncode == 2
    assert PASSWORD not in result.stdout + result.stderr


def test_a_startup_that_fails_is_one_line_after_the_servers_log(
    tmp_path: Path, redis_url: str
) -> None:
    """Given a checkpoint file that cannot be created (its folder is a file), when
    `toolfleet serve` starts, then its startup fails and it ends with one line saying
    why, a non-zero exit and no traceback."""
    (tmp_path / "not-a-dir").write_text("")
    result = _toolfleet(
        "serve",
        "--no-auth",
        "--port",
        "0",
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=redis_url,
        TOOLFLEET_NAMESPACE=f"tft-startup-{os.getpid()}",
        TOOLFLEET_CHECKPOINT_PATH=str(tmp_path / "not-a-dir" / "checkpoints.sqlite"),
    )

    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    assert "Traceback" not in text, text
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the service could not start: "), text
    assert "not-a-dir" in last, text


def test_sigterm_ends_serve_within_its_drain_time(tmp_path: Path, redis_url: str) -> None:
    """Given a running `toolfleet serve` with a client holding a stream open, when it gets
    SIGTERM, then it exits by itself within its drain time (``TOOLFLEET_DRAIN_SECONDS``:
    uvicorn's graceful shutdown, then the lifespan's), never needing a SIGKILL."""
    from tests.support.fleet import fleet_settings
    from tests.support.serving import start_server

    drain = 5.0
    server = start_server(
        fleet_settings(redis_url, tmp_path), tmp_path, "drain", model=None, drain_seconds=drain
    )
    token = server.settings.api_tokens[0]
    headers = {"Authorization": f"Bearer {token}"}
    created = httpx.post(f"{server.url}/threads", json={}, headers=headers, timeout=10)
    thread_id = created.json()["thread_id"]
    opened = threading.Event()

    def hold_stream() -> None:
        # The thread's stream: open until the server ends it (no run comes).
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream(
                "GET", f"{server.url}/threads/{thread_id}/stream", headers=headers, timeout=60
            ) as response,
        ):
            opened.set()
            for _ in response.iter_bytes():
                pass

    holder = threading.Thread(target=hold_stream, daemon=True)
    holder.start()
    assert opened.wait(10), server.log()[-2000:]
    started = time.monotonic()
    server.stop(grace=drain + 15)
    took = time.monotonic() - started

    # Ended by itself: 0, or uvicorn re-raising the SIGTERM it handled; never killed.
    assert server.returncode in (0, -signal.SIGTERM), (server.returncode, server.log()[-3000:])
    assert took < drain + 10, (took, server.log()[-3000:])
    holder.join(10)
    assert not holder.is_alive()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "missing.json"),
        ("{not json", "langgraph.json"),
        ('{"graphs": {"a": "./no.py:g"}}', "no.py"),
    ],
    ids=["missing", "not-json", "graph-not-found"],
)
def test_serve_with_a_bad_config_is_one_line(
    tmp_path: Path, redis_url: str, content: str | None, needle: str
) -> None:
    """Given a project file that is missing, not JSON, or names a graph file that does
    not exist, when `toolfleet serve --config` starts, then it says so in a line and exits
    with 2 before it listens anywhere."""
    path = tmp_path / ("missing.json" if content is None else "langgraph.json")
    if content is not None:
        path.write_text(content)
    result = _toolfleet(
        "serve",
        "--no-auth",
        "--config",
        str(path),
        cwd=tmp_path,
        TOOLFLEET_BROKER_URL=redis_url,
        TOOLFLEET_NAMESPACE=f"tft-config-{os.getpid()}",
    )

    _assert_short_error(result, needle)
    assert result.returncode == 2
