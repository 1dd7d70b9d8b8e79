"""run_python on real prefork workers: the fleet's credentials stay out of reach, the
per-call memory and process limits hold, and nothing a call starts outlives it.

The broker URL carries a real password (a Redis ACL user made for the test), so the
secret a snippet hunts for is the one the worker really connects with.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import redis
from rich.console import Console

from orchestrator import dispatcher_for
from orchestrator.call import PreparedCall
from orchestrator.cli.status import collect, render
from orchestrator.local import WorkerProcess
from tests.support.fleet import RUN_ID, wait_until, worker_env
from tests.support.sandbox import (
    Beacon,
    NobodyWorker,
    NoSysAdminWorker,
    NoUserNamespaceWorker,
    nobody_dir,
    sandbox_python,
)
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
print("seen", sorted(int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me))
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
{report}
        os._exit(0)
    os._exit(0)
time.sleep({linger})
"""

VICTIM = """
import os, time
secret = "TOOLFLEET-SECRET-" + {secret!r}
held = ("in memory: " + secret).encode()
with open("notes.txt", "w") as f:
    f.write(secret)
{report}
time.sleep({hold})
print("victim survived", flush=True)
"""

# Another call's snippet looks for every other snippet process it can see (run with -I)
# and tries to read its source, its work/notes.txt and its memory, then to SIGKILL it.
ATTACKER = r"""
import os, re, signal, time
me = os.getpid()
pattern = re.compile(rb"TOOLFLEET-SECRET-[0-9a-f]{{32}}")
victims = set()
deadline = time.monotonic() + {wait}
while time.monotonic() < deadline and not victims:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{{name}}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[1:2] == [b"-I"]:
            victims.add((int(name), argv[2].decode()))
    time.sleep(0.1)
found = []
for pid, script in sorted(victims):
    for path in (script, f"/proc/{{pid}}/cwd/notes.txt"):
        try:
            with open(path, "rb") as f:
                found += [m.decode() for m in pattern.findall(f.read())]
        except OSError as exc:
            print("refused", path, type(exc).__name__)
    try:
        with open(f"/proc/{{pid}}/maps") as maps, open(f"/proc/{{pid}}/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if perms.startswith("r") and end - start < 2**28:
                    try:
                        mem.seek(start)
                        found += [m.decode() for m in pattern.findall(mem.read(end - start))]
                    except OSError:
                        continue
    except OSError as exc:
        print("refused memory", pid, type(exc).__name__)
    try:
        os.kill(pid, signal.SIGKILL)
        found.append(f"killed {{pid}}")
    except OSError as exc:
        print("refused kill", pid, type(exc).__name__)
print("victims", len(victims))
print("found", sorted(set(found)))
"""

FILL = """
import os, time
total = 0
try:
    with open({path!r}, "wb") as f:
        block = b"x" * (16 * 2**20)
        while total < {size} * 2**20:
            f.write(block)
            f.flush()
            total += len(block)
except OSError as exc:
    print("refused after", total // 2**20, "MiB:", exc, flush=True)
else:
    print("wrote", total // 2**20, "MiB", flush=True)
time.sleep(2)
"""

STOP_SUPERVISOR = """
import os, signal, time
parent = os.getppid()
try:
    os.kill(parent, signal.SIGSTOP)
    print("sent SIGSTOP to", parent, flush=True)
except OSError as exc:
    print("could not stop", parent, exc, flush=True)
for _ in range(3):
    if os.fork() == 0:
        block = b"x" * (300 * 2**20)
        time.sleep(30)
        os._exit(0)
time.sleep(6)
print("all allocated", flush=True)
"""


WRITE_SHARED = """
import os
written = []
for folder in {folders!r}:
    path = os.path.join(folder, {name!r})
    try:
        with open(path, "w") as f:
            f.write("left by another tenant")
    except OSError as exc:
        print("refused", folder, type(exc).__name__, flush=True)
    else:
        written.append(path)
print("written", written, flush=True)
"""

READ_SHARED = """
import os
print("seen", [p for p in {paths!r} if os.path.exists(p)], flush=True)
"""

MEMFD = """
import os, mmap, time
views = []
block = b"x" * (16 * 2**20)
for n in range({count}):
    fd = os.memfd_create(f"tft-hidden-{{n}}")
    total = 0
    while total < {size} * 2**20:
        os.write(fd, block)
        total += len(block)
    if {mapped}:
        views.append(mmap.mmap(fd, 2**20))
        os.close(fd)
    print("wrote", total // 2**20, "MiB", flush=True)
time.sleep(3)
print("held", flush=True)
"""


def world_writable_folders() -> list[str]:
    """Every folder of this host a snippet's uid may write to: world-writable, found on
    every file system but /proc and /sys."""
    done = subprocess.run(
        [
            "find",
            "/",
            "(",
            "-path",
            "/proc",
            "-o",
            "-path",
            "/sys",
            ")",
            "-prune",
            "-o",
            "-type",
            "d",
            "-perm",
            "-0002",
            "-print",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return sorted(set(done.stdout.split()) | {"/run/lock", "/dev/shm", "/var/tmp", "/tmp"})


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
def beacon() -> Iterator[Beacon]:
    listener = Beacon()
    yield listener
    listener.close()


@pytest.fixture
def nobody_tmp() -> Iterator[Path]:
    path = nobody_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def assert_no_call_left(worker: WorkerProcess) -> None:
    """Nothing a call started is left below the worker: its only descendants are its pool
    processes (forks of the worker, with its command line)."""
    main = psutil.Process(worker.pid)

    def strays() -> list[str]:
        return [
            f"{p.pid} {p.cmdline()}"
            for p in main.children(recursive=True)
            if p.cmdline() != main.cmdline()
        ]

    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not strays(), timeout=5, what="the call's processes to be gone")
    assert strays() == []


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


def sandbox_settings(make_settings: Callable[..., Settings], **overrides: Any) -> Settings:
    values: dict[str, Any] = {"tool_modules": (), "sandbox_python": sandbox_python()}
    values.update(overrides)
    return make_settings(**values)


def assert_no_leak(out: str) -> None:
    """The snippet's parent is its call's init (pid 1 of the call's pid namespace), the
    only other process it sees: no process of the worker or of another call is there to
    read (the walk up from the parent ends at once), and none shows the password."""
    lines = dict(line.split(" ", 1) for line in out.split("--- stdout ---\n")[1].splitlines()[:4])
    assert eval(lines["chain"]) == [], out
    assert eval(lines["seen"]) == [1], out
    assert eval(lines["readable"]) == [], out
    assert eval(lines["leaks"]) == [], out


def test_given_root_worker_when_snippet_hunts_for_the_broker_password_then_none_found(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    password_url: tuple[str, str],
) -> None:
    """Given a prefork worker running as root whose broker URL holds a password, when a
    snippet reads the environment and command line of its parent, every ancestor and
    every other process it can see, then it sees none but its call's init and finds the
    password nowhere."""
    url, password = password_url
    settings = sandbox_settings(make_settings, broker_url=url)
    worker = start_worker(settings, queues=("tools",))

    result = run(settings, SNOOP.format(secret=password))

    assert result.status == "success", result
    assert "exit code: 0" in result.content
    assert_no_leak(result.content)
    assert_no_call_left(worker)


def test_given_unprivileged_worker_when_snippet_hunts_for_the_broker_password_then_none_found(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    password_url: tuple[str, str],
    nobody_tmp: Path,
    tmp_path: Path,
) -> None:
    """Given a prefork worker running as an unprivileged user (the snippet then runs as
    that same user, in a user namespace of the call's), when the snippet hunts for the
    broker password through /proc, then it sees none but its call's init and finds the
    password nowhere."""
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
    assert_no_leak(result.content)


def test_given_six_children_of_400_mb_when_run_then_stopped_at_the_call_memory_limit(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given the default per-call memory limit (512 MiB), when a snippet's six children
    allocate 400 MB each, then the call is stopped at the limit with a message saying so,
    and every child is dead."""
    settings = sandbox_settings(make_settings)
    worker = start_worker(settings, queues=("tools",))

    result = run(settings, MEMORY, timeout=30)

    out = result.content
    assert out.startswith("stopped at the memory limit: the call's processes used "), out
    assert "over the 512 MiB a call may use" in out
    assert "all allocated" not in out
    assert pids(out)
    assert_no_call_left(worker)


def test_given_a_fork_of_20_when_the_limit_is_8_then_stopped_at_the_process_limit(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a per-call limit of 8 processes, when a snippet forks 20 children, then the
    call is stopped at the process limit and none of its children is left."""
    settings = sandbox_settings(make_settings, sandbox_max_processes=8)
    worker = start_worker(settings, queues=("tools",))

    result = run(settings, FORKS, timeout=30)

    out = result.content
    assert out.startswith("stopped at the process limit: the call ran "), out
    assert "over the 8 a call may run" in out
    assert "forked 20" not in out
    assert pids(out)
    assert_no_call_left(worker)


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
    beacon: Beacon,
    tmp_path: Path,
) -> None:
    """Given a snippet whose grandchild leaves in a session of its own and reports over
    the network 4 s later, when the call ends (the snippet exits, its timeout passes, or
    the soft time limit interrupts the worker's wait), then the report never comes."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    settings = sandbox_settings(make_settings, config=policy)
    worker = start_worker(settings, queues=("tools",))
    linger, timeout = {"exit": (0, 20), "timeout": (30, 1), "soft_time_limit": (30, 30)}[ending]
    report = "\n".join("        " + line for line in beacon.send_code("'escaped'").splitlines())
    started = time.monotonic()

    result = run(settings, ESCAPE.format(delay=4, report=report, linger=linger), timeout)

    if ending == "soft_time_limit":
        assert result.status == "error", result
    else:
        assert result.status == "success", result
    # The grandchild would have reported by now: 4 s after it started, plus a margin.
    wait_until(lambda: time.monotonic() > started + 7, timeout=30, what="the report's time")
    assert beacon.messages == []
    assert_no_call_left(worker)


def test_given_two_concurrent_calls_when_one_hunts_the_other_then_it_reads_and_kills_nothing(
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    beacon: Beacon,
) -> None:
    """Given a root worker running two calls at once, the first holding a secret in its
    source, its memory and work/notes.txt, when the second looks for every other snippet
    process it can see and reads its source, notes and /proc/<pid>/mem and SIGKILLs it,
    then it finds no such process: no secret leaks and the first call runs to its end."""
    settings = sandbox_settings(make_settings)
    worker = start_worker(settings, queues=("tools",), concurrency=2)
    secret = secrets.token_hex(16)
    victim_code = VICTIM.format(secret=secret, report=beacon.send_code("'started'"), hold=12)

    with ThreadPoolExecutor(1) as pool:
        victim = pool.submit(run, settings, victim_code, 30)
        wait_until(lambda: beacon.messages == ["started"], timeout=60, what="the first call")
        attacker = run(settings, ATTACKER.format(wait=6), 30)
        first = victim.result(timeout=120)

    assert attacker.status == "success", attacker
    assert "exit code: 0" in attacker.content, attacker.content
    assert secret not in attacker.content and "killed" not in attacker.content, attacker.content
    assert first.status == "success", first
    assert "exit code: 0" in first.content and "victim survived" in first.content, first.content
    assert_no_call_left(worker)


@pytest.mark.parametrize("folder", ["/dev/shm", "/tmp"])
def test_given_a_snippet_filling_a_tmpfs_when_run_then_it_counts_and_goes_with_the_call(
    folder: str, make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given the default memory limit (512 MiB), when a snippet writes 768 MiB into a file
    in /dev/shm or /tmp, then it cannot write it all (the write fails or the call is
    stopped at the memory limit), and the file is not there after the call."""
    settings = sandbox_settings(make_settings)
    worker = start_worker(settings, queues=("tools",))
    path = Path(folder) / f"tft-fill-{uuid.uuid4().hex}"
    try:
        result = run(settings, FILL.format(path=str(path), size=768), timeout=30)
        left = path.exists()
    finally:
        path.unlink(missing_ok=True)

    out = result.content
    assert result.status == "success", result
    assert "wrote 768 MiB" not in out, out
    assert out.startswith("stopped at the memory limit") or "refused after" in out, out
    assert not left
    assert_no_call_left(worker)


def test_given_unprivileged_worker_when_snippet_stops_its_parent_then_limits_still_hold(
    make_settings: Callable[..., Settings], nobody_tmp: Path, tmp_path: Path
) -> None:
    """Given a prefork worker running as an unprivileged user, when a snippet sends
    SIGSTOP to its parent and then its three children take 300 MB each, then the call is
    still stopped at the memory limit (512 MiB) and nothing of it is left."""
    settings = sandbox_settings(make_settings, workspace_root=nobody_tmp / "ws")
    worker = NobodyWorker(
        settings, queues=("tools",), log_file=tmp_path / "nobody.log", extra_env={}
    ).start()
    try:
        worker.wait_ready()
        result = run(settings, STOP_SUPERVISOR, timeout=20)
        out = result.content
        assert out.startswith("stopped at the memory limit"), out
        assert "all allocated" not in out, out
        assert_no_call_left(worker)
    finally:
        worker.stop(grace=5)


@pytest.mark.parametrize("interpreter", ["worker", "venv in a closed folder"])
def test_given_root_worker_and_interpreter_under_a_closed_folder_when_run_then_it_runs(
    interpreter: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """Given a root worker on default settings (the worker's own interpreter, wherever it
    lives), or with TOOLFLEET_SANDBOX_PYTHON a venv in a folder only root may enter, when
    a snippet runs, then it runs (as another user than root)."""
    overrides: dict[str, Any] = {"tool_modules": ()}
    if interpreter != "worker":
        closed = tmp_path / "closed"
        closed.mkdir(mode=0o700)
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(closed / "venv")],
            check=True,
            timeout=60,
        )
        overrides["sandbox_python"] = str(closed / "venv" / "bin" / "python")
    settings = make_settings(**overrides)
    start_worker(settings, queues=("tools",))

    result = run(settings, "import os, sys\nprint('ran as', os.getuid(), sys.prefix)")

    assert result.status == "success", result
    assert "exit code: 0" in result.content, result.content
    assert "ran as " in result.content and "ran as 0 " not in result.content, result.content


def isolation_shown(settings: Settings, worker: WorkerProcess) -> tuple[str | None, str]:
    """The isolation ``toolfleet status`` gives for ``worker``, and its rendered text."""
    status = collect(settings, timeout=2)
    (found,) = [w for w in status.workers if w.name == worker.hostname]
    console = Console(record=True, width=200)
    render(status, console)
    return found.sandbox_isolation, console.export_text()


SHM_FILE = """
import os
print("uid", os.getuid(), os.getgid(), os.getgroups(), flush=True)
with open({path!r}, "w") as f:
    f.write("left behind")
"""


@pytest.mark.parametrize("min_isolation", ["namespaces", "uid"])
def test_given_root_worker_without_namespaces_when_run_then_refused_unless_uid_accepted(
    min_isolation: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Given a root worker without CAP_SYS_ADMIN (no mount or pid namespaces, as in a
    container), when a call runs, then on default settings it is refused with one line
    naming what is missing, and with TOOLFLEET_SANDBOX_MIN_ISOLATION=uid it runs as a uid
    of TOOLFLEET_SANDBOX_UIDS, whose file in the shared /dev/shm is removed after it;
    toolfleet status shows the worker's isolation either way."""
    settings = sandbox_settings(make_settings, sandbox_min_isolation=min_isolation)
    worker = NoSysAdminWorker(
        settings, queues=("tools",), log_file=tmp_path / "w.log", extra_env=worker_env(settings)
    ).start()
    path = Path("/dev/shm") / f"tft-{uuid.uuid4().hex}"
    try:
        worker.wait_ready()
        result = run(settings, SHM_FILE.format(path=str(path)))
        shown, text = isolation_shown(settings, worker)
        left = path.exists()
        assert_no_call_left(worker)
    finally:
        worker.stop(grace=5)
        path.unlink(missing_ok=True)

    if min_isolation == "namespaces":
        assert result.status == "error", result
        line = result.content.splitlines()[0]
        assert (
            "run_python refuses: this worker cannot run calls in namespaces of their own (" in line
        )
        assert "Operation not permitted" in line and "TOOLFLEET_SANDBOX_MIN_ISOLATION=uid" in line
        assert shown == "uid (refusing calls)" and "uid (refusing calls)" in text
        assert not left
    else:
        assert result.status == "success", result
        (ids,) = [line for line in result.content.splitlines() if line.startswith("uid ")]
        uid = int(ids.split()[1])
        assert 60000 <= uid <= 60063 and ids == f"uid {uid} {uid} []", result.content
        assert shown == "uid" and "uid" in text
        assert not left


def test_given_unprivileged_worker_without_user_namespaces_when_run_then_refused(
    make_settings: Callable[..., Settings], nobody_tmp: Path, tmp_path: Path
) -> None:
    """Given a worker running as an unprivileged user on a host where it may not create
    user namespaces, when a call runs, then it is refused with one line naming what is
    missing, and toolfleet status shows the worker refusing calls."""
    settings = sandbox_settings(make_settings, workspace_root=nobody_tmp / "ws")
    worker = NoUserNamespaceWorker(
        settings, queues=("tools",), log_file=tmp_path / "nobody.log", extra_env={}
    ).start()
    try:
        worker.wait_ready()
        result = run(settings, "print('ran')")
        shown, text = isolation_shown(settings, worker)
    finally:
        worker.stop(grace=5)

    assert result.status == "error", result
    line = result.content.splitlines()[0]
    assert "run_python refuses: this worker, not root, cannot create user namespaces (" in line
    assert "TOOLFLEET_SANDBOX_MIN_ISOLATION=none" in line and "ran" not in result.content
    assert shown == "none (refusing calls)" and "none (refusing calls)" in text


def test_given_a_namespaced_worker_when_status_read_then_namespaces_shown(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a root worker where the kernel gives namespaces, then toolfleet status shows
    its run_python calls isolated by namespaces."""
    settings = sandbox_settings(make_settings)
    worker = start_worker(settings, queues=("tools",))

    shown, text = isolation_shown(settings, worker)

    assert shown == "namespaces" and "run_python isolation" in text


def leave_files_and_look_again(settings: Settings) -> tuple[ToolResult, list[Path], ToolResult]:
    """A call that writes a file into every world-writable folder of the host, the files
    left on the host after it, and the next call's look for them."""
    name = f"tft-left-{uuid.uuid4().hex}"
    folders = [f for f in world_writable_folders() if Path(f).is_dir()]
    paths = [Path(f) / name for f in folders]
    try:
        first = run(settings, WRITE_SHARED.format(folders=folders, name=name), timeout=60)
        left = [p for p in paths if p.exists()]
        second = run(settings, READ_SHARED.format(paths=[str(p) for p in paths]))
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return first, left, second


def test_given_root_worker_when_a_snippet_writes_every_world_writable_folder_then_none_keeps_it(
    make_settings: Callable[..., Settings], start_worker: Callable[..., WorkerProcess]
) -> None:
    """Given a root worker with namespaces, when a snippet writes a file into every
    world-writable folder of the host (/run/lock, /var/tmp, /dev/shm, /tmp, ...), then each
    write is refused or lands in the call's own tmpfs: no file is on the host after the
    call, and the next call sees none."""
    settings = sandbox_settings(make_settings)
    worker = start_worker(settings, queues=("tools",))

    first, left, second = leave_files_and_look_again(settings)

    assert first.status == "success" and "exit code: 0" in first.content, first.content
    assert left == [], first.content
    assert "seen []" in second.content, second.content
    assert_no_call_left(worker)


def test_given_uid_isolation_when_a_snippet_writes_every_world_writable_folder_then_swept(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Given a root worker without namespaces that accepts the uid isolation, when a
    snippet writes a file into every world-writable folder of the host, then none of them
    is there after the call and the next call (another uid) sees none."""
    settings = sandbox_settings(make_settings, sandbox_min_isolation="uid")
    worker = NoSysAdminWorker(
        settings, queues=("tools",), log_file=tmp_path / "w.log", extra_env=worker_env(settings)
    ).start()
    try:
        worker.wait_ready()
        first, left, second = leave_files_and_look_again(settings)
    finally:
        worker.stop(grace=5)

    assert first.status == "success" and "exit code: 0" in first.content, first.content
    assert "/run/lock/" in first.content, first.content
    assert left == [], first.content
    assert "seen []" in second.content, second.content


def test_given_uid_isolation_when_a_snippet_fills_run_lock_then_it_counts_in_the_memory_limit(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Given a root worker with the uid isolation and the default memory limit (512 MiB),
    when a snippet writes 600 MiB into /run/lock, then the call is stopped at the memory
    limit (or the write fails) and the file is gone after it."""
    settings = sandbox_settings(make_settings, sandbox_min_isolation="uid")
    worker = NoSysAdminWorker(
        settings, queues=("tools",), log_file=tmp_path / "w.log", extra_env=worker_env(settings)
    ).start()
    path = Path("/run/lock") / f"tft-fill-{uuid.uuid4().hex}"
    try:
        worker.wait_ready()
        result = run(settings, FILL.format(path=str(path), size=600), timeout=40)
        left = path.exists()
    finally:
        worker.stop(grace=5)
        path.unlink(missing_ok=True)

    out = result.content
    assert "wrote 600 MiB" not in out, out
    assert out.startswith("stopped at the memory limit") or "refused after" in out, out
    assert not left


@pytest.mark.parametrize("mapped", [False, True], ids=["fd-held", "only-mapped"])
def test_given_a_memfd_over_the_limit_when_run_then_stopped_at_the_memory_limit(
    mapped: bool,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Given the default memory limit (512 MiB), when a snippet writes 1,536 MiB into an
    anonymous memfd_create file held by its descriptor, or 384 MiB into each of four
    memfd files kept only by a 1 MiB mapping once their descriptor is closed, then the
    call is stopped at the memory limit."""
    settings = sandbox_settings(make_settings)
    worker = start_worker(settings, queues=("tools",))
    count, size = (4, 384) if mapped else (1, 1536)

    result = run(settings, MEMFD.format(count=count, size=size, mapped=mapped), timeout=40)

    out = result.content
    assert out.startswith("stopped at the memory limit"), out
    assert "held" not in out, out
    assert_no_call_left(worker)
