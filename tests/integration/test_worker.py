"""The worker: stock Celery CLI, one task per tool, JSON only, the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.local import settings_env
from tests.support.fleet import REPO, worker_env
from tool_workers.contract.broker import create_app
from tool_workers.contract.models import ToolRequest, WorkerEntry
from tool_workers.contract.names import task_id_for, task_name, worker_registry_key
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(120)

TEST_TOOLS = {
    "add", "whoami", "sleep_for", "boom", "with_artifact", "blocks", "finish", "hang",
    "hard_hang", "charge", "touch", "flaky", "opaque_artifact", "echo_cls", "slow_effect",
    "my_call_id", "count_todos", "state_keys", "runtime_info", "remember", "set_flag",
    "progress", "quiet", "chatty",
}  # fmt: skip


def celery_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings), **worker_env(settings)}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tool_workers", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def call(tool: str, **args: Any) -> PreparedCall:
    call_id = f"call-{time.monotonic_ns()}"
    return PreparedCall(tool=tool, call_id=call_id, args=args, task_id=task_id_for(call_id))


def test_one_registered_task_per_tool(shared_fleet: Settings) -> None:
    """Given a running worker, when `celery inspect registered` asks it, then it lists one
    task named tools.<name> per tool of the configured module."""
    result = celery_cli(
        shared_fleet, "inspect", "registered", "-d", "tf-shared-threads@" + os.uname().nodename,
        "--json",
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    replies = json.loads(result.stdout.strip().splitlines()[-1])
    (registered,) = replies.values()
    assert {name for name in registered if name.startswith("tools.")} == {
        task_name(tool) for tool in TEST_TOOLS
    }


def test_registry_lists_tools_per_worker_and_queue(shared_fleet: Settings) -> None:
    """Given two workers consuming different queues, when the registry is read, then each
    lists only the tools routed to its queues, with schema and options."""
    client = redis.Redis.from_url(shared_fleet.broker_url)
    host = os.uname().nodename
    threads = WorkerEntry.model_validate_json(
        client.get(worker_registry_key(shared_fleet.key_prefix, f"tf-shared-threads@{host}"))
    )
    prefork = WorkerEntry.model_validate_json(
        client.get(worker_registry_key(shared_fleet.key_prefix, f"tf-shared-prefork@{host}"))
    )

    threads_tools = {spec.name: spec for spec in threads.tools}
    assert "hang" not in threads_tools  # routed to the "prefork" queue
    assert {spec.name for spec in prefork.tools} == TEST_TOOLS
    add = threads_tools["add"]
    assert add.parameters["properties"] == {
        "a": {"type": "integer"},
        "b": {"type": "integer"},
    }
    assert add.queue == "tools"
    assert threads_tools["finish"].return_direct is True
    assert threads_tools["charge"].options["idempotent"] is False
    hang = {spec.name: spec for spec in prefork.tools}["hang"]
    assert hang.options["time_limit"] == 4 and hang.options["soft_time_limit"] == 2


def test_stopped_worker_drops_out_of_registry(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a worker serving tools, when it stops, then its tools leave the registry."""
    settings = make_settings()
    worker = start_worker(settings, pool="solo", concurrency=1)
    dispatcher = dispatcher_for(settings=settings)
    dispatcher.registry().refresh()
    assert "add" in dispatcher.served_tools()

    worker.stop()
    dispatcher.registry().refresh()

    assert dispatcher.served_tools() == {}


def test_killed_worker_expires_from_registry(
    make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a worker that dies without cleaning up, when three refresh intervals pass,
    then its entry has expired."""
    settings = make_settings(registry_refresh=0.5)
    worker = start_worker(settings, pool="solo", concurrency=1)
    worker.kill()
    dispatcher = dispatcher_for(settings=settings)

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and dispatcher.served_tools():
        time.sleep(0.2)
        dispatcher.registry().refresh()

    assert dispatcher.served_tools() == {}


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_any_pool_serves_tools(
    pool: str, make_settings: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Given a worker on any Celery pool, when a call is sent, then it runs there."""
    settings = make_settings()
    start_worker(settings, pool=pool, concurrency=2)
    dispatcher = dispatcher_for(settings=settings)

    result = dispatcher.wait(call("add", a=20, b=22), timeout=30)

    assert result.status == "success" and result.content == "42"


def test_pickle_is_refused_and_worker_keeps_serving(shared_fleet: Settings) -> None:
    """Given a pickled message on the tools queue, when the worker receives it, then it is
    not executed (its call is answered with a failure), and the next JSON call is served."""
    app = create_app(shared_fleet)
    pickled_id = task_id_for(f"pickled-{time.monotonic_ns()}")
    request = ToolRequest(tool="add", call_id="p", args={"a": 1, "b": 1}, idempotency_key="p")
    app.send_task(
        task_name("add"),
        args=[request.model_dump()],
        task_id=pickled_id,
        queue="tools",
        serializer="pickle",
    )
    dispatcher = dispatcher_for(settings=shared_fleet)

    result = dispatcher.wait(call("add", a=2, b=2), timeout=30)

    assert result.content == "4"
    meta = app.backend.get_task_meta(pickled_id)  # never ran; answered with a failure
    assert meta["status"] == "FAILURE"
    assert type(meta["result"]).__name__ == "UnreadableCall"


def test_second_dispatch_of_a_call_attaches_to_the_first(
    shared_fleet: Settings, counter: Any
) -> None:
    """Given one call dispatched by two orchestrator processes (two dispatchers, two
    listeners), when both wait, then the tool ran once and both get its result."""
    from orchestrator.dispatch.dispatcher import CeleryDispatcher
    from tests.support.fleet import effects

    first = CeleryDispatcher(create_app(shared_fleet), shared_fleet, owns_app=True)
    second = CeleryDispatcher(create_app(shared_fleet), shared_fleet, owns_app=True)
    the_call = call("touch", tag="once", seconds=0.3)
    try:
        first.submit([the_call])
        second.submit([the_call])
        a = first.wait(the_call, timeout=30)
        b = second.wait(the_call, timeout=30)
    finally:
        first.close()
        second.close()

    assert a.content == b.content == "touched once (run 1)"
    assert effects(counter, shared_fleet, "touch")[the_call.task_id] == 1


BROKEN_TOOL_MODULES = {
    # A tool module importing a dependency this worker lacks.
    "tf_needs_dep": (
        "import json\nimport definitely_not_installed_xyz\n",
        "ModuleNotFoundError: No module named 'definitely_not_installed_xyz' (at {path}:2)",
    ),
    "tf_bad_syntax": ("def tool(:\n    pass\n", "SyntaxError: invalid syntax (at {path}:1)"),
    "tf_bad_factory": (
        "def get_tools(settings):\n    raise RuntimeError('no key for the search API')\n",
        "tf_bad_factory.get_tools() failed: RuntimeError: no key for the search API (at {path}:2)",
    ),
    "tf_not_there": (None, "no module named 'tf_not_there' on this worker's path"),
}


@pytest.mark.parametrize("module", sorted(BROKEN_TOOL_MODULES))
def test_worker_with_a_broken_tool_module_says_why_in_one_line_and_exits(
    module: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Given TOOLFLEET_TOOL_MODULES naming a module that fails to import (a missing
    dependency, a syntax error, a failing get_tools(), a typo), when `celery -A
    tool_workers worker` starts from the project's directory, then it exits non-zero
    with the real cause and where it was raised on one line, and nothing else."""
    source, expected = BROKEN_TOOL_MODULES[module]
    path = tmp_path / f"{module}.py"
    if source is not None:
        path.write_text(source)
    settings = make_settings(tool_modules=(module,))
    env = {**os.environ, **settings_env(settings), **worker_env(settings)}

    started = subprocess.run(
        [str(Path(sys.executable).parent / "celery"), "-A", "tool_workers", "worker"],
        env=env,
        cwd=tmp_path,  # Celery imports the app (and so the tool modules) from here
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert started.returncode != 0
    lines = (started.stdout + started.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("toolfleet: ")
    assert expected.format(path=path) in lines[0], lines[0]
