"""run_python's supervisor, run as the program run_python starts, and the process
attributes the worker sets (no Redis, no worker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.sandbox import NOBODY, as_nobody, sandbox_python
from tool_workers.builtin import supervisor
from tool_workers.builtin.sandbox import sandbox_tools

pytestmark = pytest.mark.timeout(60)

SUPERVISOR = Path(supervisor.__file__)

GRANDCHILD = """
import os, time
said, told = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("grandchild", os.getpid(), flush=True)
        os.write(told, b"x")
        time.sleep(60)
        os._exit(0)
    os._exit(0)
os.read(said, 1)  # the grandchild has said who it is before the snippet goes on
"""


def config(tmp_path: Path, code: str, **overrides: Any) -> supervisor.Config:
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(code))
    values: dict[str, Any] = {
        "python": sys.executable,
        "script": str(script),
        "cwd": str(tmp_path),
        "env": {"PATH": os.defpath},
        "timeout": 20.0,
        "memory_limit": 512 * 2**20,
        "max_processes": 16,
        "report_fd": -1,
    }
    values.update(overrides)
    return supervisor.Config(**values)


def start(cfg: supervisor.Config) -> tuple[subprocess.Popen[str], int]:
    """Start the supervisor on ``cfg``; it and the read end of its report pipe."""
    read_fd, write_fd = os.pipe()
    arg = json.dumps({**asdict(cfg), "report_fd": write_fd})
    proc = subprocess.Popen(
        [sys.executable, "-s", "-P", str(SUPERVISOR), arg],
        stdout=subprocess.PIPE,
        pass_fds=(write_fd,),
        text=True,
    )
    os.close(write_fd)
    return proc, read_fd


def finish(proc: subprocess.Popen[str], read_fd: int) -> tuple[dict[str, Any], str]:
    """Wait for the supervisor; its report and the snippet's stdout."""
    out, _ = proc.communicate(timeout=40)
    with os.fdopen(read_fd) as report:
        return json.loads(report.read()), out


def supervise(cfg: supervisor.Config) -> tuple[dict[str, Any], str]:
    return finish(*start(cfg))


def labelled(out: str, label: str) -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith(f"{label} ")]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_given_snippet_exits_when_supervised_then_exit_code_and_setsid_grandchild_killed(
    tmp_path: Path,
) -> None:
    report, out = supervise(config(tmp_path, GRANDCHILD + "raise SystemExit(3)\n"))

    assert report["outcome"] == "exited" and report["exit_code"] == 3
    (grandchild,) = labelled(out, "grandchild")
    assert gone(grandchild)


def test_given_tree_over_the_memory_limit_when_supervised_then_stopped_as_memory(
    tmp_path: Path,
) -> None:
    code = """
    import os, time
    for _ in range(3):
        if os.fork() == 0:
            block = b"x" * (100 * 2**20)
            time.sleep(60)
    time.sleep(60)
    """
    report, _ = supervise(config(tmp_path, code, memory_limit=200 * 2**20))

    assert report["outcome"] == "memory"
    assert report["reason"]["memory"] > 200 * 2**20
    assert report["exit_code"] == -signal.SIGKILL


def test_given_tree_over_the_process_limit_when_supervised_then_stopped_as_processes(
    tmp_path: Path,
) -> None:
    # Paced for the poll (every 50 ms): for a user other than root the RLIMIT_NPROC
    # backstop (twice the limit above the user's threads) would stop a burst of forks
    # itself, before the poll sees it.
    code = """
    import os, time
    for _ in range(10):
        if os.fork() == 0:
            time.sleep(60)
        time.sleep(0.2)
    time.sleep(60)
    """
    report, _ = supervise(config(tmp_path, code, max_processes=4))

    assert report["outcome"] == "processes" and report["reason"]["processes"] > 4


def test_given_endless_snippet_when_timeout_passes_then_timeout_and_tree_killed(
    tmp_path: Path,
) -> None:
    report, out = supervise(
        config(tmp_path, GRANDCHILD + "import time; time.sleep(60)\n", timeout=1)
    )

    assert report["outcome"] == "timeout" and report["exit_code"] == -signal.SIGKILL
    assert all(gone(pid) for pid in labelled(out, "grandchild"))


def test_given_sigterm_when_supervising_then_stopped_and_tree_killed(tmp_path: Path) -> None:
    code = GRANDCHILD + "print('ready', 0, flush=True)\nimport time; time.sleep(60)\n"
    proc, read_fd = start(config(tmp_path, code))
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]

    proc.send_signal(signal.SIGTERM)
    report, rest = finish(proc, read_fd)

    assert report["outcome"] == "stopped"
    (grandchild,) = labelled("".join(lines) + rest, "grandchild")
    assert gone(grandchild)


def test_given_the_worker_process_dies_when_supervising_then_orphaned_and_tree_killed(
    tmp_path: Path,
) -> None:
    """Given a supervisor whose parent (the pool process) is SIGKILLed (a hard time
    limit), then the supervisor notices and kills the snippet's tree itself."""
    cfg = config(tmp_path, GRANDCHILD + "import time; time.sleep(60)\n")
    arg = json.dumps({**asdict(cfg), "report_fd": 2})
    parent_code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-s', '-P', {str(SUPERVISOR)!r}, {arg!r}])\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", parent_code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as parent:
        assert parent.stdout is not None and parent.stderr is not None
        (grandchild,) = labelled(parent.stdout.readline(), "grandchild")

        parent.kill()
        parent.wait()
        report = json.loads(parent.stderr.readline())  # written once the tree is dead

    assert report["outcome"] == "orphaned"
    assert gone(grandchild)


def test_given_an_interpreter_that_cannot_start_when_supervised_then_failed(
    tmp_path: Path,
) -> None:
    report, _ = supervise(config(tmp_path, "pass", python=str(tmp_path / "no-python")))

    assert report["outcome"] == "failed" and "FileNotFoundError" in report["reason"]["error"]


def test_given_rlimits_when_snippet_starts_then_address_space_and_core_are_limited(
    tmp_path: Path,
) -> None:
    code = """
    import resource
    print("as", resource.getrlimit(resource.RLIMIT_AS)[0])
    print("core", resource.getrlimit(resource.RLIMIT_CORE)[0])
    """
    report, out = supervise(config(tmp_path, code, memory_limit=300 * 2**20))

    assert report["outcome"] == "exited"
    assert labelled(out, "as") == [300 * 2**20] and labelled(out, "core") == [0]


@pytest.mark.parametrize("undumpable", [False, True])
@pytest.mark.root
def test_given_same_user_process_when_it_reads_environ_then_only_a_dumpable_one_is_readable(
    undumpable: bool,
) -> None:
    """Given two processes of one unprivileged user, when one reads the other's
    /proc/<pid>/environ, then it can, unless the other has made itself non-dumpable."""
    python = sandbox_python()
    reach = [SUPERVISOR.parent, Path(_psutil_path())]
    mark = (  # the supervisor module alone, as run_python's supervisor runs it
        "import importlib.util as u\n"
        f"spec = u.spec_from_file_location('supervisor', {str(SUPERVISOR)!r})\n"
        "module = u.module_from_spec(spec)\n"
        "import sys; sys.modules['supervisor'] = module\n"
        "spec.loader.exec_module(module)\n"
        "module.make_undumpable()\n"
    )
    target_code = (
        mark if undumpable else ""
    ) + "print('up', flush=True)\nimport time; time.sleep(30)\n"
    with subprocess.Popen(
        as_nobody([python, "-c", target_code], reach, env=f'PYTHONPATH="{_psutil_path()}"'),
        stdout=subprocess.PIPE,
        env={"SECRET_FOR_TEST": "hunter2", "PATH": os.defpath},
        text=True,
    ) as target:
        try:
            assert target.stdout is not None and target.stdout.readline() == "up\n"
            reader = subprocess.run(
                as_nobody([python, "-c", f"print(open('/proc/{target.pid}/environ').read())"], []),
                capture_output=True,
                text=True,
                timeout=30,
            )
        finally:
            target.kill()

    if undumpable:
        assert "PermissionError" in reader.stderr and "hunter2" not in reader.stdout
    else:
        assert "SECRET_FOR_TEST=hunter2" in reader.stdout


def _psutil_path() -> str:
    return str(Path(psutil.__file__).resolve().parents[1])


def test_given_the_supervisor_is_killed_when_run_python_waits_then_what_it_left_is_killed(
    tmp_path: Path,
) -> None:
    """Given a run_python call whose supervisor dies mid-call (SIGKILL), then the worker
    side, a subreaper while the call runs, kills the snippet's processes it gets back."""
    (tool,) = sandbox_tools(python=sandbox_python())
    code = GRANDCHILD + "print('main', 0, flush=True)\nimport time; time.sleep(60)\n"
    result: list[str] = []
    caller = threading.Thread(
        target=lambda: result.append(tool.invoke({"code": code, "timeout": 30}))
    )
    caller.start()

    def supervisor_proc() -> psutil.Process | None:
        for child in psutil.Process().children():
            if child.cmdline()[3:4] == [str(SUPERVISOR)] and child.children(recursive=True):
                return child
        return None

    deadline = time.monotonic() + 20
    while (found := supervisor_proc()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found is not None
    # The grandchild has left its session and been reparented to the supervisor (a
    # subreaper) once the supervisor has two children: the snippet and the grandchild.
    while len(found.children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = found.children(recursive=True)
    assert len(tree) >= 2  # and the intermediate, a zombie its parent never waits for
    found.kill()
    caller.join(40)

    assert result and result[0].startswith("interrupted:"), result
    assert tree and all(gone(proc.pid) for proc in tree)


def test_config_round_trips_through_json(tmp_path: Path) -> None:
    cfg = replace(config(tmp_path, "pass"), uid=NOBODY, gid=NOBODY)
    assert supervisor.Config(**json.loads(json.dumps(asdict(cfg)))) == cfg


def test_given_snippets_that_end_at_once_when_many_run_together_then_each_is_seen_ending(
    tmp_path: Path,
) -> None:
    """Given eight supervisors at once, each on a snippet that ends as it starts (a busy
    machine: the snippet may end before the supervisor looks), then every one reports the
    snippet's own exit, never a timeout (the snippet's end reaped elsewhere, unseen)."""
    reports: list[dict[str, Any]] = []

    def one(i: int) -> None:
        folder = tmp_path / str(i)
        folder.mkdir()
        reports.append(supervise(config(folder, "pass", timeout=8.0))[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [r["outcome"] for r in reports] == ["exited"] * 8, reports
