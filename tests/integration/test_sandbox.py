"""run_python on real prefork workers: the fleet's credentials stay out of reach, the
per-call memory and process limits hold, and nothing a call starts outlives it.

The broker URL carries a real password (a Redis ACL user made for the test), so the
secret a snippet hunts for is the one the worker really connects with.
"""

from __future__ import annotations

import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.local import WorkerProcess
from tests.support.fleet import RUN_ID, wait_until
from tests.support.sandbox import NobodyWorker, nobody_dir, sandbox_python
from tool_workers.contract.models import ToolResult
from tool_workers.contract.names import task_id_for
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)

SNOOP = """
import os
secret = {secret!r}.encode()
me = os.getpid()
chain, pid = [], os.getppid()
while pid > 1:
    chain.append(pid)
    with open(f"/proc/{{pid}}/stat") as stat:
        pid = int(stat.read().rsplit(")", 1)[1].split()[1])
readable, leaks = [], []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == me:
        continue
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{{name}}/{{part}}", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if part == "environ" and int(name) in chain:
            readable.append(int(name))
        if secret in data:
            leaks.append((int(name), part))
print("chain", chain)
print("readable", sorted(readable))
print("leaks", leaks)
"""

MEMORY = """
import os, time
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (400 * 2**20)
        time.sleep(60)
        os._exit(0)
    print("child", pid, flush=True)
time.sleep(8)
print("all allocated", flush=True)
"""

FORKS = """
import os, time
n = 0
while n < 20:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.2)
        continue
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
    print("child", pid, flush=True)
print("forked", n, flush=True)
time.sleep(5)
"""

ESCAPE = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep({delay})
        with open({marker!r}, "w") as f:
            f.write("escaped")
        os._exit(0)
    os._exit(0)
time.sleep({linger})
"""


@pytest.fixture
def password_url(redis_url: str) -> Iterator[tuple[str, str]]:
    """A broker URL of a Redis ACL user with a random password, and that password."""
    admin = redis.Redis.from_url(redis_url)
    user, password = f"tft-{RUN_ID}-{uuid.uuid4().hex[:8]}", secrets.token_hex(16)
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    parts = urlsplit(redis_url)
    try:
        yield (
            f"redis://{user}:{password}@{parts.hostname}:{parts.port or 6379}{parts.path}",
            password,
        )
    finally:
        admin.acl_deluser(user)
        admin.close()


@pytest.fixture
def nobody_tmp() -> Iterator[Path]:
    path = nobody_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(settings: Settings, code: str, timeout: float = 20.0) -> ToolResult:
    call_id = f"call-{uuid.uuid4().hex}"
    call = PreparedCall(
        tool="run_python",
        call_id=call_id,
        args={"code": code, "timeout": timeout},
        task_id=task_id_for(call_id),
    )
    return dispatcher_for(settings=settings).wait(call, timeout=120)


def pids(out: str, label: str = "child") -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith(f"{label} ")]


def dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def sandbox_settings(make_settings: Callable[..., Settings], **overrides: Any) -> Settings:
    values: dict[str, Any] = {"tool_modules": (), "sandbox_python": sandbox_python()}
    values.update(overrides)
    return make_settings(**values)


def assert_no_leak(out: str, worker: WorkerProcess) -> None:
    lines = dict(line.split(" ", 1) for line in out.split("--- stdout ---\n")[1].splitlines()[:3])
    chain = eval(lines["chain"])
    assert worker.pid in chain, out  # the walk went through the whole worker
    assert eval(lines["readable"]) == [], out
    assert eval(lines["leaks"]) == [], out


def test_given_root_worker_when_snippet_hunts_for_the_broker_password_then_none_found(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    password_url: tuple[str, str],
) -> None:
    """Given a prefork worker running as root whose broker URL holds a password, when a
    snippet reads the environment and command line of its parent, every ancestor up to
    the worker's main process and every other process, then it finds the password in none
    (the snippet runs as nobody)."""
    url, password = password_url
    settings = sandbox_settings(make_settings, broker_url=url)
    worker = start_worker(settings, queues=("tools",))

    result = run(settings, SNOOP.format(secret=password))

    assert result.status == "success", result
    assert "exit code: 0" in result.content
    assert_no_leak(result.content, worker)


def test_given_unprivileged_worker_when_snippet_hunts_for_the_broker_password_then_none_found(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    password_url: tuple[str, str],
    nobody_tmp: Path,
    tmp_path: Path,
) -> None:
    """Given a prefork worker running as an unprivileged user (the snippet then runs as
    that same user), when the snippet hunts for the broker password through /proc, then
    the worker's processes, non-dumpable, show it nothing."""
    url, password = password_url
    settings = sandbox_settings(make_settings, broker_url=url, workspace_root=nobody_tmp / "ws")
    worker = NobodyWorker(
        settings, queues=("tools",), log_file=tmp_path / "nobody.log", extra_env={}
    ).start()
    try:
        worker.wait_ready()
        result = run(settings, SNOOP.format(secret=password))
    finally:
        worker.stop(grace=5)

    assert result.status == "success", result
    assert_no_leak(result.content, worker)


def test_given_six_children_of_400_mb_when_run_then_stopped_at_the_call_memory_limit(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given the default per-call memory limit (512 MiB), when a snippet's six children
    allocate 400 MB each, then the call is stopped at the limit with a message saying so,
    and every child is dead."""
    settings = sandbox_settings(make_settings)
    start_worker(settings, queues=("tools",))

    result = run(settings, MEMORY, timeout=30)

    out = result.content
    assert out.startswith("stopped at the memory limit: the call's processes used "), out
    assert "over the 512 MiB a call may use" in out
    assert "all allocated" not in out
    assert pids(out) and all(dead(pid) for pid in pids(out))


def test_given_a_fork_of_20_when_the_limit_is_8_then_stopped_at_the_process_limit(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a per-call limit of 8 processes, when a snippet forks 20 children, then the
    call is stopped at the process limit and none of its children is left."""
    settings = sandbox_settings(make_settings, sandbox_max_processes=8)
    start_worker(settings, queues=("tools",))

    result = run(settings, FORKS, timeout=30)

    out = result.content
    assert out.startswith("stopped at the process limit: the call ran "), out
    assert "over the 8 a call may run" in out
    assert "forked 20" not in out
    assert pids(out) and all(dead(pid) for pid in pids(out))


POLICY = """
[defaults]
time_limit = 60

[tools.run_python]
time_limit = 8
soft_time_limit = 2
"""


@pytest.mark.parametrize("ending", ["exit", "timeout", "soft_time_limit"])
def test_given_setsid_double_forked_child_when_the_call_ends_then_it_is_dead(
    ending: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    nobody_tmp: Path,
    tmp_path: Path,
) -> None:
    """Given a snippet whose grandchild leaves in a session of its own and writes a marker
    file 4 s later, when the call ends (the snippet exits, its timeout passes, or the
    soft time limit interrupts the worker's wait), then the marker is never written."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    settings = sandbox_settings(make_settings, config=policy)
    start_worker(settings, queues=("tools",))
    marker = nobody_tmp / "escaped"
    linger, timeout = {"exit": (0, 20), "timeout": (30, 1), "soft_time_limit": (30, 30)}[ending]
    started = time.monotonic()

    result = run(settings, ESCAPE.format(delay=4, marker=str(marker), linger=linger), timeout)

    if ending == "soft_time_limit":
        assert result.status == "error", result
    else:
        assert result.status == "success", result
    # The grandchild would have written by now: 4 s after it started, plus a margin.
    wait_until(lambda: time.monotonic() > started + 7, timeout=30, what="the marker's time")
    assert not marker.exists()
