"""The built-in toolset, called the way a worker calls it: ``tool.invoke(tool_call)``.

A tool that raises lets the exception out of ``invoke`` (the worker turns it into an error
message for the model), so refusals are checked with ``pytest.raises``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from pydantic import ValidationError

from tests.support.sandbox import sandbox_python
from tool_workers.builtin import get_tools
from tool_workers.builtin.sandbox import sandbox_tools
from tool_workers.builtin.workspace import workspace_tools
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import Settings

REPO = Path(__file__).resolve().parents[2]
ALL_TOOLS = {"read_file", "list_dir", "grep", "write_file", "run_python", "sleep", "echo"}


def call(tool: BaseTool, **args: Any) -> str:
    """Invoke ``tool`` with a model-style tool call and return the ToolMessage's text."""
    message = tool.invoke({"type": "tool_call", "name": tool.name, "args": args, "id": "c1"})
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == "c1"
    assert isinstance(message.content, str)
    return message.content


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ws"  # deliberately missing: get_tools must create it


@pytest.fixture
def tools(root: Path) -> dict[str, BaseTool]:
    settings = Settings(workspace_root=root, sandbox_python=sandbox_python())
    return {tool.name: tool for tool in get_tools(settings)}


@pytest.fixture
def outside(tmp_path: Path, tools: dict[str, BaseTool], root: Path) -> Path:
    """A directory beside the workspace, reachable from it through the symlink ``escape``."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("secret\n")
    (root / "escape").symlink_to(out, target_is_directory=True)
    (root / "leak.txt").symlink_to(out / "secret.txt")
    return out


# --- the toolset ------------------------------------------------------------------------


def test_given_missing_root_when_tools_built_then_root_created_and_all_tools_served(
    root: Path, tools: dict[str, BaseTool]
) -> None:
    assert root.is_dir()
    assert set(tools) == ALL_TOOLS


def test_given_fresh_interpreter_when_builtin_imported_then_celery_not_imported() -> None:
    code = (
        "import sys, tool_workers.builtin\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'celery'], 'celery imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


# --- path confinement -------------------------------------------------------------------

ESCAPING_CALLS: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("read_file", lambda p: {"path": p}),
    ("list_dir", lambda p: {"path": p}),
    ("grep", lambda p: {"pattern": "secret", "path": p}),
    ("write_file", lambda p: {"path": p, "content": "pwned"}),
]


@pytest.mark.parametrize(("name", "make_args"), ESCAPING_CALLS, ids=[c[0] for c in ESCAPING_CALLS])
@pytest.mark.parametrize(
    "escape", ["dotdot", "dotdot_dir", "absolute", "symlink_dir", "symlink_file"]
)
def test_given_path_outside_root_when_called_then_refused(
    tools: dict[str, BaseTool],
    outside: Path,
    name: str,
    make_args: Callable[[str], dict[str, Any]],
    escape: str,
) -> None:
    path = {
        "dotdot": "../outside/secret.txt",
        "dotdot_dir": "sub/../..",
        "absolute": str(outside / "secret.txt"),
        "symlink_dir": "escape/secret.txt",
        "symlink_file": "leak.txt",
    }[escape]
    with pytest.raises(ValueError, match="is outside the workspace root"):
        call(tools[name], **make_args(path))
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_given_absolute_path_inside_root_when_read_then_allowed(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "a.txt").write_text("inside\n")
    assert call(tools["read_file"], path=str(root / "a.txt")) == "     1\tinside"


def test_given_symlink_to_outside_when_grepping_root_then_it_is_skipped(
    tools: dict[str, BaseTool], outside: Path
) -> None:
    assert call(tools["grep"], pattern="secret").startswith("no matches")


# --- read_file --------------------------------------------------------------------------


def test_given_long_file_when_read_with_offset_and_limit_then_numbered_slice_and_note(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = call(tools["read_file"], path="f.txt", offset=2, limit=3)
    lines = out.splitlines()
    assert lines[:3] == ["     3\tline 3", "     4\tline 4", "     5\tline 5"]
    assert "offset=5" in lines[3]


def test_given_short_file_when_read_whole_then_no_truncation_note(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "f.txt").write_text("a\nb")
    assert call(tools["read_file"], path="f.txt") == "     1\ta\n     2\tb"


@pytest.mark.parametrize(
    ("content", "offset", "expected"),
    [("", 0, "f.txt is empty."), ("a\nb\n", 5, "f.txt has 2 lines; offset 5 is past the end.")],
)
def test_given_empty_or_short_file_when_read_past_end_then_says_so(
    tools: dict[str, BaseTool], root: Path, content: str, offset: int, expected: str
) -> None:
    (root / "f.txt").write_text(content)
    assert call(tools["read_file"], path="f.txt", offset=offset) == expected


def test_given_binary_file_when_read_then_politely_refused(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    out = call(tools["read_file"], path="img.png")
    assert "binary" in out and "img.png" in out


def test_given_missing_file_or_directory_when_read_then_clear_error(
    tools: dict[str, BaseTool], root: Path
) -> None:
    with pytest.raises(FileNotFoundError, match=r"no file 'nope\.txt'"):
        call(tools["read_file"], path="nope.txt")
    with pytest.raises(IsADirectoryError, match="list_dir"):
        call(tools["read_file"], path=".")


def test_given_a_huge_one_line_file_when_read_then_memory_stays_small(
    tools: dict[str, BaseTool], root: Path
) -> None:
    """A 50 MB file without a newline is read in bounded pieces (a 400 MB one used to be
    read whole, tripling the pool process's memory)."""
    with (root / "huge.txt").open("wb") as f:
        for _ in range(50):
            f.write(b"z" * 1_000_000)

    tracemalloc.start()
    try:
        out = call(tools["read_file"], path="huge.txt")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert out == "     1\t" + "z" * 2000 + "... [line cut at 2000 chars]"
    assert peak < 5_000_000, peak


def test_given_byte_cap_when_read_then_stops_there_and_offset_reads_on(root: Path) -> None:
    root.mkdir()
    tools = {t.name: t for t in workspace_tools(root, max_read_bytes=1000)}
    (root / "f.txt").write_text("".join(f"{i:099d}\n" for i in range(1, 31)))  # 100 B each

    first = call(tools["read_file"], path="f.txt").splitlines()
    rest = call(tools["read_file"], path="f.txt", offset=10).splitlines()

    assert len(first) == 11 and first[9].startswith("    10\t")
    assert "cap is 1000 bytes" in first[10] and "offset=10" in first[10]
    assert rest[0].startswith("    11\t")


def test_given_read_file_policy_when_tools_built_then_its_cap_wins(
    root: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        "[defaults]\nmax_read_bytes = 10000\n[tools.read_file]\nmax_read_bytes = 300\n"
    )
    settings = Settings(workspace_root=root, config=policy)
    tools = {t.name: t for t in get_tools(settings)}
    (root / "f.txt").write_text("".join(f"{i:099d}\n" for i in range(1, 31)))

    lines = call(tools["read_file"], path="f.txt").splitlines()

    assert len(lines) == 4 and "cap is 300 bytes" in lines[3]


# --- list_dir ---------------------------------------------------------------------------


def test_given_files_and_dirs_when_listed_then_sorted_with_type_and_size(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "b.txt").write_text("12345")
    (root / "a_dir").mkdir()
    (root / "c").symlink_to(root / "b.txt")
    lines = call(tools["list_dir"]).splitlines()
    assert lines[1].split() == ["dir", "-", "a_dir/"]
    assert lines[2].split() == ["file", "5", "b.txt"]
    assert lines[3].split()[:3] == ["link", "-", "c"]


def test_given_more_entries_than_cap_when_listed_then_truncation_noted(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "many").mkdir()
    for i in range(501):
        (root / "many" / f"f{i:03}").touch()
    lines = call(tools["list_dir"], path="many").splitlines()
    assert len(lines) == 1 + 500 + 1
    assert lines[-1] == "[500 of 501 entries shown]"


def test_given_file_path_when_listed_then_clear_error(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "f.txt").touch()
    with pytest.raises(NotADirectoryError, match="not a directory"):
        call(tools["list_dir"], path="f.txt")


# --- grep -------------------------------------------------------------------------------


@pytest.fixture
def tree(root: Path) -> Path:
    (root / "sub").mkdir()
    (root / "a.py").write_text("x = 1\nneedle = 2\n")
    (root / "b.txt").write_text("needle in text\n")
    (root / "sub" / "c.py").write_text("# needle here\n")
    (root / "blob.bin").write_bytes(b"needle\0\0")
    return root


def test_given_tree_when_grepping_then_relpath_lineno_line(
    tools: dict[str, BaseTool], tree: Path
) -> None:
    assert call(tools["grep"], pattern=r"need+le").splitlines() == [
        "a.py:2: needle = 2",
        "b.txt:1: needle in text",
        "sub/c.py:1: # needle here",
        "[1 binary or large files skipped]",
    ]


def test_given_glob_when_grepping_then_only_matching_names_searched(
    tools: dict[str, BaseTool], tree: Path
) -> None:
    assert call(tools["grep"], pattern="needle", glob="*.py").splitlines() == [
        "a.py:2: needle = 2",
        "sub/c.py:1: # needle here",
    ]
    assert call(tools["grep"], pattern="needle", glob="sub/*") == "sub/c.py:1: # needle here"


def test_given_max_matches_when_exceeded_then_stops_and_says_so(
    tools: dict[str, BaseTool], tree: Path
) -> None:
    lines = call(tools["grep"], pattern="needle", max_matches=1).splitlines()
    assert lines == ["a.py:2: needle = 2", "[stopped after 1 matches]"]


def test_given_invalid_regex_when_grepping_then_helpful_value_error(
    tools: dict[str, BaseTool], tree: Path
) -> None:
    with pytest.raises(ValueError, match=r"invalid regular expression '\(unclosed'"):
        call(tools["grep"], pattern="(unclosed")


def test_given_catastrophic_pattern_when_grepping_then_stopped_within_its_budget(
    root: Path,
) -> None:
    """A pattern that backtracks without end stops after the grep's matching budget with
    an error naming the pattern (it ran to the hard limit, and forever on threads)."""
    root.mkdir()
    (root / "a.txt").write_text("a" * 40 + "!\n")
    grep = {t.name: t for t in workspace_tools(root, grep_seconds=0.5)}["grep"]

    started = time.monotonic()
    with pytest.raises(ValueError, match=r"took more than 0.5 s to match"):
        call(grep, pattern=r"(a|aa)+$")

    assert time.monotonic() - started < 5


# --- write_file -------------------------------------------------------------------------


def test_given_new_nested_path_when_written_then_dirs_created_and_bytes_reported(
    tools: dict[str, BaseTool], root: Path
) -> None:
    out = call(tools["write_file"], path="x/y/z.txt", content="héllo")
    assert out == "wrote 6 bytes to x/y/z.txt"
    assert (root / "x/y/z.txt").read_text(encoding="utf-8") == "héllo"


def test_given_existing_file_when_overwritten_then_content_replaced_and_mode_kept(
    tools: dict[str, BaseTool], root: Path
) -> None:
    target = root / "f.txt"
    target.write_text("old")
    target.chmod(0o600)
    call(tools["write_file"], path="f.txt", content="new")
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o600


def test_given_replace_fails_when_writing_then_old_file_intact_and_no_temp_left(
    tools: dict[str, BaseTool], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "f.txt").write_text("old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        call(tools["write_file"], path="f.txt", content="new")
    assert (root / "f.txt").read_text() == "old"
    assert sorted(p.name for p in root.iterdir()) == ["f.txt"]


def test_given_directory_path_when_written_then_refused(
    tools: dict[str, BaseTool], root: Path
) -> None:
    (root / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        call(tools["write_file"], path="d", content="x")


# --- run_python -------------------------------------------------------------------------


def test_given_printing_code_when_run_then_exit_zero_and_stdout(
    tools: dict[str, BaseTool],
) -> None:
    out = call(tools["run_python"], code="import sys\nprint('hi')\nprint('warn', file=sys.stderr)")
    assert out == "exit code: 0\n--- stdout ---\nhi\n\n--- stderr ---\nwarn\n"


def test_given_raising_code_when_run_then_exit_one_and_traceback(
    tools: dict[str, BaseTool],
) -> None:
    out = call(tools["run_python"], code="raise ValueError('boom')")
    assert out.startswith("exit code: 1\n")
    assert "ValueError: boom" in out.split("--- stderr ---")[1]


def test_given_worker_env_and_cwd_when_run_then_secrets_hidden_and_cwd_empty(
    tools: dict[str, BaseTool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFLEET_SECRET", "hunter2")
    code = "import os\nprint(os.environ.get('TOOLFLEET_SECRET'), os.listdir('.'))"
    assert "None []" in call(tools["run_python"], code=code)


def _sleeper(token: str) -> str:
    """A snippet line starting a child that sleeps a minute, ``token`` on its command line
    (its pid, in the call's pid namespace, means nothing to the test)."""
    return (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}])\n"
        "print('started', flush=True)\n"
    )


def _gone(token: str, within: float = 3.0) -> bool:
    """Whether no process with ``token`` on its command line is left (within a while)."""

    def left() -> bool:
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if token in proc.cmdline():
                    return True
        return False

    deadline = time.monotonic() + within
    while left():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_given_endless_code_when_timeout_passes_then_group_killed_and_reported(
    tools: dict[str, BaseTool],
) -> None:
    token = f"tft-{uuid.uuid4().hex}"
    code = _sleeper(token) + "time.sleep(60)\n"
    t0 = time.monotonic()
    out = call(tools["run_python"], code=code, timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert out.startswith("timed out after 1 s")
    assert "killed by SIGKILL" in out and "started" in out
    assert _gone(token)


def test_given_background_child_when_code_exits_then_child_killed(
    tools: dict[str, BaseTool],
) -> None:
    token = f"tft-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    out = call(tools["run_python"], code=_sleeper(token))
    assert out.startswith("exit code: 0") and "started" in out
    assert time.monotonic() - t0 < 10
    assert _gone(token)


def test_given_timeout_over_max_when_run_then_capped() -> None:
    (tool,) = sandbox_tools(max_timeout=0.3, python=sandbox_python())
    out = call(tool, code="import time; time.sleep(30)", timeout=30)
    assert out.startswith("timed out after 0.3 s (capped from 30 s)")


def test_given_memory_limit_when_code_allocates_more_then_memory_error() -> None:
    (tool,) = sandbox_tools(memory_limit_bytes=256 * 2**20, python=sandbox_python())
    out = call(tool, code="b = bytearray(1024 * 2**20)")
    assert out.startswith("exit code: 1\n")
    assert "MemoryError" in out


def test_given_output_limit_when_code_prints_more_then_output_capped() -> None:
    (tool,) = sandbox_tools(output_limit=100, python=sandbox_python())
    out = call(tool, code="print('x' * 1000)")
    assert "x" * 100 + "\n[truncated: 1001 bytes written, first 100 shown]" in out
    assert "x" * 101 not in out


# --- diagnostics ------------------------------------------------------------------------


def test_given_seconds_when_sleeping_then_sleeps_and_reports(
    tools: dict[str, BaseTool],
) -> None:
    t0 = time.monotonic()
    assert call(tools["sleep"], seconds=0.05) == "slept 0.05 s"
    assert time.monotonic() - t0 >= 0.05


@pytest.mark.parametrize("seconds", [-1, 3601])
def test_given_out_of_bounds_seconds_when_sleeping_then_invalid_args(
    tools: dict[str, BaseTool], seconds: float
) -> None:
    with pytest.raises(ValidationError):
        call(tools["sleep"], seconds=seconds)


def test_given_text_when_echoed_then_returned_unchanged(tools: dict[str, BaseTool]) -> None:
    assert call(tools["echo"], text="héllo\nworld") == "héllo\nworld"


@pytest.mark.root
def test_given_malformed_sandbox_uids_when_tools_built_then_config_error(root: Path) -> None:
    assert os.geteuid() == 0  # the uid range is read on a root worker only
    with pytest.raises(ConfigError, match="TOOLFLEET_SANDBOX_UIDS: not uids or ranges"):
        get_tools(Settings(workspace_root=root, sandbox_uids="sixty-thousand"))


@pytest.mark.root
def test_given_sandbox_uids_when_calls_run_then_each_runs_as_a_uid_of_the_range() -> None:
    (tool,) = sandbox_tools(uids="61000-61001", python=sandbox_python())
    code = "import os; print('ids', os.getuid(), os.getgid(), os.getgroups())"
    outs = [call(tool, code=code) for _ in range(4)]
    ids = [line for out in outs for line in out.splitlines() if line.startswith("ids ")]
    assert len(ids) == 4
    assert set(ids) <= {"ids 61000 61000 []", "ids 61001 61001 []"}


def test_given_a_workspace_file_when_a_snippet_reads_and_writes_then_it_reads_only(
    tools: dict[str, BaseTool], root: Path, tmp_path: Path
) -> None:
    """Given the workspace below a folder only root may enter, when a snippet reads a file
    of it at its own path and writes beside it, then it reads the file (the workspace is
    in its mount namespace, read-only) and the write fails; nothing beside the workspace
    is there."""
    (root / "data.txt").write_text("workspace data\n")
    (tmp_path / "beside.txt").write_text("not for snippets\n")
    code = (
        "import os\n"
        f"print('read', open({str(root / 'data.txt')!r}).read().strip())\n"
        f"print('beside', os.path.exists({str(tmp_path / 'beside.txt')!r}))\n"
        f"open({str(root / 'new.txt')!r}, 'w')\n"
    )
    out = call(tools["run_python"], code=code)
    assert "read workspace data" in out and "beside False" in out, out
    assert "OSError: [Errno 30] Read-only file system" in out, out
    assert not (root / "new.txt").exists()
