"""``run_python``: run a model's Python snippet in a fresh, supervised process tree.

Each call runs the snippet with ``python -I`` (isolated mode) in a new, empty working
directory with a minimal environment, under a supervisor process of its own
(:mod:`tool_workers.builtin.supervisor`). stdout and stderr are captured and capped.

Calls are kept apart from each other at the strongest of three levels the host allows
(found once, when the tool is built, by a probe of the supervisor's):

- ``namespaces``: each call runs in pid, mount and IPC namespaces of its own (and, on a
  worker that is not root, a user namespace of its own, where it keeps the worker's uid).
  It sees only its own processes in ``/proc``, and its ``/tmp``, ``/var/tmp``,
  ``/dev/shm`` and ``/run/lock`` are folders of one private tmpfs, whose size is the
  call's memory limit, counted in that limit and gone with the call; every other mount
  is read-only in its mount namespace, so it writes nowhere on the host. Its source
  never touches the host's file system (the supervisor gets it on stdin). On a root
  worker the call also runs as a uid of its own from ``TOOLFLEET_SANDBOX_UIDS``, and
  the folders of its interpreter's installation (and venv) are made reachable to that
  uid in its mount namespace even below a folder closed to it (``/root``, a 0700
  home): each closed folder is covered by an empty tmpfs and the installation
  bind-mounted back, read-only. The workspace of the file tools is there too,
  read-only, at its own path.
- ``uid`` (root, no namespaces: a container without ``CAP_SYS_ADMIN``): each call runs
  as a uid of its own, owner of its 0700 directory; it shares the host's ``/tmp``,
  ``/dev/shm`` and ``/proc`` (where it sees, but cannot read, trace or signal, the other
  calls' processes); what its uid keeps at the top of the host's world-writable
  folders (:func:`world_writable_folders`) counts in its memory limit and is removed
  after the call, with the System V IPC objects it made.
- ``none`` (not root, no user namespaces): every call runs as the worker's own user.

Below ``TOOLFLEET_SANDBOX_MIN_ISOLATION`` (``namespaces`` by default) every call is refused
with one line naming what is missing; the tool's metadata names the level, which the
worker publishes in its registry entry and ``toolfleet status`` shows.

What else is contained:

- **Credentials.** The worker's processes are non-dumpable (set at worker start), so a
  snippet cannot read their ``/proc/<pid>/environ`` or memory, nor ptrace them, even as
  the same user; the supervisor starts from a clean environment and is non-dumpable too.
  The snippet gets only ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG``, no supplementary
  group, no new privileges and no open file but its stdin (``/dev/null``), stdout and
  stderr.
- **Memory, per call.** The resident memory of all the call's processes together (but
  shared memory pages), once each file without a name they hold open or mapped (a
  ``memfd_create`` file, a shared anonymous mapping, an unlinked file), System V shared
  memory, and what the call keeps in its private tmpfs, are checked every ~50 ms against
  ``TOOLFLEET_SANDBOX_MEMORY_LIMIT``; past it the whole tree is killed and the result says
  so. Each process also has that limit as its address space (``RLIMIT_AS``), so one
  allocation beyond it fails at once with MemoryError.
- **Processes, per call.** More than ``TOOLFLEET_SANDBOX_MAX_PROCESSES`` live processes
  in the tree kill it the same way; ``RLIMIT_NPROC`` (the user's current processes plus
  twice that number) stops a fast fork bomb in between, except for root.
- **Lifetime.** The supervisor is a child subreaper and gets SIGTERM when the worker's
  process dies; with namespaces the call's init (the first process of its pid namespace)
  dies with the supervisor, and the kernel then kills every process of the namespace. The
  supervisor runs as root (a root worker) or outside the call's namespaces, so (except
  at the ``none`` level) the snippet can neither stop nor outlive it. When the snippet
  exits, times out or passes a limit, when the worker's wait is interrupted (the soft
  time limit, an exception) or the pool process dies (the hard time limit), every
  descendant is SIGKILLed and reaped until none is left. Should the supervisor itself die, the pool
  process (a subreaper while the call runs) kills what it leaves.

Still not contained: the network (a snippet can connect anywhere the worker can, the
broker included, though without its password), CPU time within the timeout, and the
host's file system beyond the folders above: a snippet reads whatever its uid may (on a
non-root worker the worker's user's files, such as a mounted ``.env``), and at the
``uid`` level writes whatever its uid may. Memory is summed as resident set size, so
private pages shared between forked processes count once per process. Isolate untrusted
code from the host with a container or VM around the
``sandbox`` queue's workers, as the compose deployment does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from tool_workers.builtin import supervisor
from tool_workers.builtin.adoption import ADOPTION
from tool_workers.contract.errors import ConfigError

__all__ = ["ISOLATION_LEVELS", "sandbox_isolation", "sandbox_tools"]

log = logging.getLogger("toolfleet.sandbox")

DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024
DEFAULT_MAX_PROCESSES = 32
DEFAULT_UIDS = "60000-60063"
DEFAULT_MAX_TIMEOUT = 60.0
DEFAULT_OUTPUT_LIMIT = 20_000
ISOLATION_LEVELS = ("none", "uid", "namespaces")
"""The isolation between calls, weakest first (``TOOLFLEET_SANDBOX_MIN_ISOLATION``)."""
ISOLATION_METADATA = "toolfleet_sandbox_isolation"
"""The key of ``run_python``'s metadata naming its isolation (and whether it refuses)."""
# Beyond the call's own timeout: the supervisor's start and its killing of the tree.
_SUPERVISOR_GRACE = 15.0
# How long a supervisor asked to stop may take before it is killed itself.
_STOP_GRACE = 2.0
# Once the supervisor has exited, how long to drain pipes still held open by a process
# it left behind before that process is killed.
_DRAIN_GRACE = 1.0
_POLL = 0.1
# How long a call waits for a uid of the pool when every one is taken.
_UID_WAIT = 10.0
_SUPERVISOR = Path(supervisor.__file__)
_PSUTIL_PATH = str(Path(psutil.__file__).resolve().parents[1])
# Where a snippet of the "uid" isolation may leave files whatever the host: found again
# with every other world-writable folder (world_writable_folders).
_SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Not files: the kernel's views, never a place a snippet leaves a file in.
_NOT_FILES = ("/proc", "/sys")
# How deep the walk for world-writable folders goes (/var/lib/php/sessions is 4 deep):
# a walk of every folder of an image with a venv or two takes seconds.
_WALK_DEPTH = 4
_LANG = {"LANG": "C.UTF-8"}


def sandbox_isolation(tools: list[BaseTool]) -> str | None:
    """The isolation ``run_python`` among ``tools`` gives its calls, as its worker publishes
    it (``None`` when it is not among them)."""
    for tool in tools:
        value = (tool.metadata or {}).get(ISOLATION_METADATA)
        if isinstance(value, str):
            return value
    return None


def parse_uids(text: str) -> list[int]:
    """The uids of ``TOOLFLEET_SANDBOX_UIDS`` (``60000-60063``, ``60000,60010-60019``).

    Raises:
        ConfigError: it is malformed, empty or holds root.
    """
    uids: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            uids += range(int(first), int(last or first) + 1)
    except ValueError:
        raise ConfigError(f"TOOLFLEET_SANDBOX_UIDS: not uids or ranges: {text!r}") from None
    if not uids or min(uids) <= 0 or max(uids) >= 2**32 - 1:
        raise ConfigError(f"TOOLFLEET_SANDBOX_UIDS: no uids but root's or above: {text!r}")
    return sorted(set(uids))


def _processes_of(uid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if uid in proc.uids():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid`` (root only), until none is left (at most ~1 s)."""
    for _ in range(100):
        procs = _processes_of(uid)
        if not procs:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.01)


def world_writable_folders() -> list[str]:
    """The folders of the host any user may write into (``/tmp``, ``/var/tmp``,
    ``/dev/shm``, ``/run/lock``, ..., on every file system but ``/proc`` and ``/sys``, to
    :data:`_WALK_DEPTH` folders below ``/``): where a call of the ``uid`` isolation, which
    has no mount namespace, may leave files. Found once, when the tool is built."""
    found = {f for f in _SHARED_TMP if os.path.isdir(f) and not os.path.islink(f)}
    for top, dirs, _ in os.walk("/", onerror=None):
        if top.rstrip("/").count("/") >= _WALK_DEPTH:
            dirs.clear()
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in _NOT_FILES]
        with contextlib.suppress(OSError):
            if os.lstat(top).st_mode & stat.S_IWOTH:
                found.add(top)
    return sorted(found)


def _remove_files_of(uid: int, folders: list[str]) -> None:
    """Remove what ``uid`` left at the top of the host's world-writable ``folders``."""
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


_IPC_RMID = 0


def _remove_ipc_of(uid: int) -> None:
    """Remove the System V shared memory segments, message queues and semaphore sets
    ``uid`` created or owns: on the host's IPC namespace they would outlive the call."""
    libc = supervisor.libc()
    removers: dict[str, Callable[[int], int]] = {
        "shm": lambda ident: libc.shmctl(ident, _IPC_RMID, None),
        "msg": lambda ident: libc.msgctl(ident, _IPC_RMID, None),
        "sem": lambda ident: libc.semctl(ident, 0, _IPC_RMID),
    }
    for kind, remove in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as table:
                header = table.readline().split()
                rows = [dict(zip(header, line.split(), strict=False)) for line in table]
        except OSError:
            continue
        for row in rows:
            if str(uid) in (row.get("uid"), row.get("cuid")):
                remove(int(row[header[1]]))


class _UidPool:
    """The uids calls run as on a root worker, one per running call across every worker
    of the host: a call holds an exclusive ``flock`` on its uid's file in a folder only
    root may write (``/run/toolfleet-sandbox``), through the worker's process and its
    supervisor (and the call's init, which inherits it), so a uid is free again only
    once all three are gone. Whatever still runs as the uid when it is taken is killed."""

    def __init__(self, uids: list[int]) -> None:
        self.uids = uids
        run = Path("/run")
        base = run if run.is_dir() and os.access(run, os.W_OK) else Path(tempfile.gettempdir())
        self.folder = base / "toolfleet-sandbox"

    def _folder(self) -> Path:
        self.folder.mkdir(mode=0o700, exist_ok=True)
        st = self.folder.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
            raise RuntimeError(
                f"run_python: {self.folder} must be a folder of root's that no one else may "
                "enter (it holds the locks of the sandbox uids)"
            )
        return self.folder

    def acquire(self) -> tuple[int, int]:
        """A free uid and the descriptor holding its lock (close it to free the uid).

        Raises:
            RuntimeError: every uid stayed taken for ``_UID_WAIT`` seconds.
        """
        folder = self._folder()
        deadline = time.monotonic() + _UID_WAIT
        while True:
            offset = secrets.randbelow(len(self.uids))
            for uid in self.uids[offset:] + self.uids[:offset]:
                fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                _kill_user(uid)
                return uid, fd
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"run_python: all {len(self.uids)} uids of TOOLFLEET_SANDBOX_UIDS are "
                    f"taken by running calls (waited {_UID_WAIT:g} s)"
                )
            time.sleep(_POLL)


@dataclass(frozen=True)
class _Isolation:
    """What this worker can give each call, and the line refusing calls when too little."""

    level: str
    missing: str | None = None
    refusal: str | None = None

    def published(self) -> str:
        return f"{self.level} (refusing calls)" if self.refusal else self.level


def _probe_namespaces() -> str | None:
    """``None`` when this worker can run calls in namespaces of their own, else why not."""
    folder = tempfile.mkdtemp(prefix="toolfleet-probe-")
    try:
        done = subprocess.run(
            [sys.executable, "-s", "-P", str(_SUPERVISOR), "--probe", folder],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": _PSUTIL_PATH},
            timeout=30,
            check=False,
        )
        refused = json.loads(done.stdout)["refused"]
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        return f"the probe failed: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return None if refused is None else str(refused)


def _closed_folder(path: str) -> str | None:
    """The first folder above ``path`` (or on its way through symlinks) that other users
    cannot enter."""
    seen = Path(path)
    for candidate in (seen, Path(os.path.realpath(path))):
        for folder in reversed(candidate.parents):
            with contextlib.suppress(OSError):
                if not folder.stat().st_mode & stat.S_IXOTH:
                    return str(folder)
    return None


def _isolation(root: bool, minimum: str, python: str) -> _Isolation:
    missing = _probe_namespaces()
    if missing is None:
        return _Isolation("namespaces")
    level = "uid" if root else "none"
    refusal = None
    if ISOLATION_LEVELS.index(level) < ISOLATION_LEVELS.index(minimum):
        if root:
            refusal = (
                "run_python refuses: this worker cannot run calls in namespaces of their own "
                f"({missing}; a container needs CAP_SYS_ADMIN and seccomp and AppArmor "
                "profiles allowing unshare and mount); TOOLFLEET_SANDBOX_MIN_ISOLATION=uid "
                "runs each call as a uid of its own instead, sharing /tmp, /dev/shm and /proc"
            )
        else:
            refusal = (
                "run_python refuses: this worker, not root, cannot create user namespaces "
                f"({missing}; see the sysctls kernel.unprivileged_userns_clone and "
                "user.max_user_namespaces); TOOLFLEET_SANDBOX_MIN_ISOLATION=none runs every "
                "call as the worker's own user instead, where calls can read and signal "
                "each other"
            )
    elif root and (closed := _closed_folder(python)) is not None:
        refusal = (
            f"run_python refuses: the sandbox uids cannot execute {python}: {closed} is "
            "closed to other users (set TOOLFLEET_SANDBOX_PYTHON to an interpreter they can "
            "execute)"
        )
    return _Isolation(level, missing, refusal)


def _reach(python: str) -> list[str]:
    """The folders of ``python``'s installation (and its venv's) a call's uid must reach."""
    found: set[str] = set()
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        found |= {sys.prefix, sys.base_prefix}
    for exe in (python, os.path.realpath(python)):
        prefix = Path(os.path.realpath(Path(exe).parent.parent))
        found.add(str(prefix))
        with contextlib.suppress(OSError):
            for line in (prefix / "pyvenv.cfg").read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    found.add(os.path.realpath(Path(value.strip()).parent))
    return sorted(os.path.realpath(p) for p in found)


class _CappedBuffer:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def text(self) -> str:
        out = self.data.decode("utf-8", errors="replace")
        if self.total > self.cap:
            out += f"\n[truncated: {self.total} bytes written, first {self.cap} shown]"
        return out


def _read_streams(
    proc: subprocess.Popen[bytes], report_fd: int, deadline: float, output_limit: int
) -> tuple[_CappedBuffer, _CappedBuffer, bytes]:
    """Read the snippet's stdout and stderr and the supervisor's report until all are
    closed and the supervisor has exited, or ``deadline`` (monotonic) passes.

    Reading both pipes as they fill (rather than ``communicate``) keeps memory bounded by
    ``output_limit`` however much the snippet prints.
    """
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _CappedBuffer(output_limit), _CappedBuffer(output_limit)
    report = bytearray()
    sinks: dict[int, Callable[[bytes], None]] = {
        proc.stdout.fileno(): out.add,
        proc.stderr.fileno(): err.add,
        report_fd: report.extend,
    }
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                if not sel.get_map():
                    break
                deadline = min(deadline, now + _DRAIN_GRACE)
            if now >= deadline:
                break
            for key, _ in sel.select(min(deadline - now, _POLL)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    sinks[key.fd](chunk)
                else:
                    sel.unregister(key.fd)
    return out, err, bytes(report)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask the supervisor to end the call (it kills its tree), then make sure it is gone."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code: {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"exit code: {code} (killed by {name})"


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


@dataclass(frozen=True)
class _Limits:
    """A call's memory (bytes) and process limits, as the result quotes them."""

    memory: int
    processes: int


def _summary(report: dict[str, Any], effective: float, timeout: float, limits: _Limits) -> str:
    """The line saying why a call was stopped ('' when the snippet ended by itself)."""
    outcome = report.get("outcome", "lost")
    reason = report.get("reason") or {}
    killed = "the process and everything it started were killed"
    if outcome == "timeout":
        capped = f" (capped from {timeout:g} s)" if timeout > effective else ""
        return f"timed out after {effective:g} s{capped}: {killed}"
    if outcome == "memory":
        return (
            f"stopped at the memory limit: the call's processes used "
            f"{_mib(reason.get('memory', 0))} together, over the {_mib(limits.memory)} "
            f"a call may use; {killed}"
        )
    if outcome == "processes":
        return (
            f"stopped at the process limit: the call ran {reason.get('processes', 0)} "
            f"processes at once, over the {limits.processes} a call may run; {killed}"
        )
    if outcome in ("stopped", "orphaned", "lost"):
        return f"interrupted: {killed}"
    return ""


def sandbox_tools(
    *,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    uids: str = DEFAULT_UIDS,
    python: str | None = None,
    min_isolation: str = "namespaces",
    workspace: Path | None = None,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> list[BaseTool]:
    """Build the ``run_python`` tool.

    Finds out (once, here) the isolation between calls this worker can give: each call in
    namespaces of its own where the kernel allows, else a uid of its own per call (root),
    else none. Below ``min_isolation`` every call is refused with one line naming what is
    missing. The tool's metadata names the isolation (:func:`sandbox_isolation`).

    Args:
        memory_limit_bytes: Memory all of one call's processes may use together, with what
            it keeps in its private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (also each
            process's ``RLIMIT_AS`` and the size of that tmpfs).
        max_processes: Live processes one call may run at once.
        uids: The uids calls run as when the worker runs as root (``60000-60063``).
        python: Interpreter snippets run with (default: the worker's own).
        min_isolation: The weakest isolation accepted: one of :data:`ISOLATION_LEVELS`.
        workspace: A folder calls may read (the file tools' workspace): with namespaces,
            bound read-only at its own path in each call's mount namespace.
        max_timeout: Longest wall-clock timeout a call may ask for, in seconds.
        output_limit: Bytes of stdout and of stderr kept; the rest is counted and dropped.

    Returns:
        A one-element list holding ``run_python``.

    Raises:
        ValueError: a limit is not positive, or ``min_isolation`` is not a level.
        ConfigError: ``uids`` is malformed.
    """
    if min(memory_limit_bytes, max_processes, max_timeout, output_limit) <= 0:
        raise ValueError("sandbox limits must be positive")
    if min_isolation not in ISOLATION_LEVELS:
        raise ValueError(f"min_isolation must be one of {', '.join(ISOLATION_LEVELS)}")
    root = os.geteuid() == 0
    pool = _UidPool(parse_uids(uids)) if root else None
    interpreter = python or sys.executable
    isolation = _isolation(root, min_isolation, interpreter)
    if isolation.refusal:
        log.warning(isolation.refusal)
    reach = []
    shared = world_writable_folders() if root and isolation.level != "namespaces" else []
    if isolation.level == "namespaces":
        reach = _reach(interpreter)
        if workspace is not None and workspace.is_dir():
            reach.append(os.path.realpath(workspace))
    limits = _Limits(memory_limit_bytes, max_processes)

    class RunPythonArgs(BaseModel):
        code: str = Field(description="Python 3 source to run as a script.")
        timeout: float = Field(
            default=min(10.0, max_timeout),
            gt=0,
            description=f"Wall-clock seconds before the run is killed (at most {max_timeout:g}).",
        )

    def run_python(code: str, timeout: float = 10.0) -> str:
        if isolation.refusal:
            raise RuntimeError(isolation.refusal)
        effective = min(timeout, max_timeout)
        tmp = tempfile.mkdtemp(prefix="toolfleet-run-python-")
        uid, lock_fd = pool.acquire() if pool is not None else (None, -1)
        try:
            report, stdout, stderr = _run(code, Path(tmp), effective, uid, lock_fd)
        finally:
            if uid is not None and isolation.level != "namespaces":
                _kill_user(uid)
                _remove_files_of(uid, shared)
                _remove_ipc_of(uid)
            if lock_fd >= 0:
                os.close(lock_fd)
            shutil.rmtree(tmp, ignore_errors=True)
        if report.get("outcome") == "failed":
            raise RuntimeError(f"run_python could not start the snippet: {report['reason']}")
        parts = [line for line in [_summary(report, effective, timeout, limits)] if line]
        code_ = report.get("exit_code")
        parts += [
            _describe_exit(code_) if code_ is not None else "exit code: unknown",
            f"--- stdout ---\n{stdout.text()}",
            f"--- stderr ---\n{stderr.text()}",
        ]
        return "\n".join(parts)

    def _config(
        code: str, tmp: Path, effective: float, uid: int | None, report_fd: int
    ) -> supervisor.Config:
        path = os.environ.get("PATH", os.defpath)
        common: dict[str, Any] = {
            "python": interpreter,
            "timeout": effective,
            "memory_limit": memory_limit_bytes,
            "max_processes": max_processes,
            "report_fd": report_fd,
            "uid": uid,
            "gid": uid,
            "parent": os.getpid(),
        }
        if isolation.level == "namespaces":
            # The source goes to the supervisor on its stdin, into the call's tmpfs only.
            work = f"{supervisor.SNIPPET_DIR}/work"
            return supervisor.Config(
                script=f"{supervisor.SNIPPET_DIR}/snippet.py",
                cwd=work,
                env={
                    "PATH": path,
                    "HOME": work,
                    "TMPDIR": supervisor.SNIPPET_DIR,
                    "LANG": "C.UTF-8",
                },
                namespaces=True,
                call_dir=str(tmp),
                reach=reach,
                **common,
            )
        # The script sits beside, not in, the working directory the snippet sees.
        script = tmp / "snippet.py"
        script.write_text(code, encoding="utf-8")
        workdir = tmp / "work"
        workdir.mkdir()
        if uid is not None:
            for item in (tmp, script, workdir):
                os.chown(item, uid, uid)
        env = {"PATH": path, "HOME": str(workdir), "TMPDIR": str(workdir), **_LANG}
        return supervisor.Config(
            script=str(script), cwd=str(workdir), env=env, shared_dirs=shared, **common
        )

    def _run(
        code: str, tmp: Path, effective: float, uid: int | None, lock_fd: int
    ) -> tuple[dict[str, Any], _CappedBuffer, _CappedBuffer]:
        read_fd, write_fd = os.pipe()
        config = _config(code, tmp, effective, uid, write_fd)
        started_at = time.time()
        proc: subprocess.Popen[bytes] | None = None
        report: dict[str, Any] = {"outcome": "lost"}
        # Unnamed: no other process finds it.
        source = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
        ADOPTION.enter()
        try:
            if config.namespaces:
                source.write(code.encode("utf-8"))
                source.seek(0)
            arg = json.dumps(asdict(config))
            proc = subprocess.Popen(
                # Not -I: the supervisor imports psutil from where the worker found it
                # (PYTHONPATH below; the environment holds nothing else of the worker's).
                [sys.executable, "-s", "-P", str(_SUPERVISOR), arg],
                stdin=source,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,) if lock_fd < 0 else (write_fd, lock_fd),
                cwd=tmp,
                env={"PATH": config.env["PATH"], "LANG": "C.UTF-8", "PYTHONPATH": _PSUTIL_PATH},
                start_new_session=True,
            )
            ADOPTION.started(proc.pid)
            os.close(write_fd)
            write_fd = -1
            deadline = time.monotonic() + effective + _SUPERVISOR_GRACE
            stdout, stderr, raw = _read_streams(proc, read_fd, deadline, output_limit)
            with contextlib.suppress(ValueError):
                report = json.loads(raw)
        finally:
            # Also reached when Celery's soft time limit interrupts the wait.
            source.close()
            if proc is not None:
                _stop(proc)
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            clean = proc is not None and proc.returncode == 0 and report["outcome"] != "lost"
            ADOPTION.leave(proc.pid if proc else None, started_at, orphans=not clean)
        return report, stdout, stderr

    persists = (
        "Nothing persists between calls"
        if isolation.level == "namespaces"
        else "Files written outside that directory may be seen by other calls while it runs"
    )
    return [
        StructuredTool.from_function(
            run_python,
            name="run_python",
            description="Run a Python 3 script in a fresh process and an empty temporary "
            f"directory, and return its exit code, stdout and stderr. {persists}. Memory "
            f"(files in /tmp and /dev/shm included) is limited to "
            f"{memory_limit_bytes // 2**20} MiB and {max_processes} processes per call; "
            f"output beyond {output_limit} bytes per stream is dropped. Print what you want "
            "to see.",
            args_schema=RunPythonArgs,
            metadata={ISOLATION_METADATA: isolation.published()},
        )
    ]
