"""The per-call supervisor of ``run_python``: one process that owns a snippet's whole tree.

``run_python`` starts this file as a program of its own (``python -s -P <this file>
CONFIG``, with only psutil's directory on ``PYTHONPATH``), never importing the worker, so
the process the snippet can see holds nothing but the config (no broker URL, no
settings). The supervisor:

1. marks itself non-dumpable (a same-user snippet cannot read its memory or environment,
   nor ptrace it), asks for SIGTERM when the worker's process dies, and makes itself a
   *child subreaper*, so every process the snippet starts, even in a session of its own
   or after a double fork, stays its descendant;
2. with ``namespaces`` (see :func:`probe`), moves into new mount and IPC namespaces (and
   a user namespace when not root), mounts the call's private tmpfs (its size the call's
   memory limit) and starts the call's *init*: the first process of a new pid namespace,
   which dies with the supervisor (``PR_SET_PDEATHSIG``) and takes every process of the
   namespace with it. The init gives the call a mount namespace of its own, where
   ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` are folders of that tmpfs,
   every other mount is read-only (:func:`read_only_host`) and ``/proc`` shows the
   namespace's processes only, and runs the snippet there. The snippet cannot see,
   signal or trace the supervisor or anything outside its namespace, and the kernel
   drops the signals it sends its init;
3. starts the snippet with per-process rlimits (``RLIMIT_AS`` = the call's memory limit,
   ``RLIMIT_CORE`` 0, ``RLIMIT_MSGQUEUE`` 0, ``RLIMIT_NPROC`` as a backstop) and no new
   privileges, as the call's own uid when it runs as root;
4. every ~50 ms sums the memory of the snippet's whole tree (:func:`measure`: resident
   memory, files without a name, System V segments) and what the call keeps in its
   tmpfs (or, without namespaces, in the host's world-writable folders), counts its
   processes, and stops the call when either passes the
   call's limit, the wall-clock timeout passes, the worker asks it to stop (SIGTERM) or
   the worker process is gone;
5. when the call ends, for whatever reason, SIGKILLs and reaps every descendant, over and
   over until it has no child left, and writes one JSON report line to the report fd.

The functions that set the process attributes (:func:`make_undumpable`,
:func:`set_child_subreaper`) and :func:`kill_descendants` are also used by the worker, and
``python supervisor.py --probe DIR`` tells it whether this host gives namespaces.
This module imports only the standard library and psutil.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno as errnos
import json
import os
import re
import resource
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

POLL_INTERVAL = 0.05
"""Seconds between two measurements of the snippet's process tree."""

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36

# unshare(2) and mount(2) flags (linux/sched.h, linux/mount.h).
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_NOATIME = 0x400
_MS_NODIRATIME = 0x800
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MS_RELATIME = 0x200000

TMPFS_FOLDERS = {"tmp": "/tmp", "var-tmp": "/var/tmp", "shm": "/dev/shm", "lock": "/run/lock"}
"""Folders of the call's tmpfs and where the snippet sees them."""
SNIPPET_DIR = "/tmp"
"""Where the snippet's script lies in its namespace; its working directory is ``work`` below."""

_libc = ctypes.CDLL(None, use_errno=True)


def libc() -> ctypes.CDLL:
    """The C library, its errno kept (for the calls ``os`` has no name for)."""
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, value, 0, 0, 0), f"prctl({option}, {value})")


def unshare(flags: int) -> None:
    """unshare(2) (``os.unshare`` is Python 3.12's)."""
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """mount(2)."""
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or 'bind'} on {target}",
    )


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when the thread that started it ends."""
    _prctl(_PR_SET_PDEATHSIG, sig)


def set_no_new_privs() -> None:
    """No exec of this process or its children gains privileges (set-uid files, caps)."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def make_undumpable() -> None:
    """Mark this process non-dumpable: its ``/proc/<pid>/environ``, ``mem`` and ``fd``
    become root's, and a process of the same user can no longer read them or ptrace it
    (only a process with ``CAP_SYS_PTRACE`` can). No core dump is written either."""
    _prctl(_PR_SET_DUMPABLE, 0)


def set_child_subreaper(on: bool = True) -> None:
    """Make this process (or stop it being) a child subreaper: an orphaned descendant is
    reparented to it instead of to init, so it can still find and kill it."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def reap_children() -> dict[int, int]:
    """Reap every child that has exited; their exit codes by pid (negative: a signal)."""
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = os.waitstatus_to_exitcode(status)


def kill_descendants(root: psutil.Process) -> int:
    """SIGKILL every descendant of ``root``.

    Returns:
        How many processes were signalled.
    """
    signalled = 0
    for proc in root.children(recursive=True):
        try:
            proc.send_signal(signal.SIGKILL)
            signalled += 1
        except psutil.Error:  # gone already, or not ours to signal
            continue
    return signalled


def kill_tree(settle: float = 0.005) -> dict[int, int]:
    """Kill and reap every descendant of this process, repeatedly, until it has no child.

    As a child subreaper every orphan comes back to this process, so "no child left"
    means no descendant left, however the snippet forked.

    Returns:
        The exit codes of the children reaped meanwhile, by pid.
    """
    me = psutil.Process()
    reaped: dict[int, int] = {}
    while True:
        kill_descendants(me)
        reaped.update(reap_children())
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        time.sleep(settle)


@dataclass(frozen=True)
class Config:
    """What one call asks of the supervisor (passed as JSON on its command line)."""

    python: str
    script: str
    cwd: str
    env: dict[str, str]
    timeout: float
    memory_limit: int
    max_processes: int
    report_fd: int
    uid: int | None = None
    gid: int | None = None
    namespaces: bool = False
    """Run the snippet in namespaces of its own (see :func:`probe`); its source is then
    read from stdin (``script`` and ``cwd`` are the paths it gets inside), and
    ``call_dir`` is where the supervisor mounts the call's tmpfs."""
    call_dir: str | None = None
    reach: list[str] = field(default_factory=list)
    """Folders (the interpreter's, the workspace) the snippet must reach, read-only, at
    their own paths in its mount namespace, even below a folder closed to its uid or
    inside its private ``/tmp``: there, each closed folder above them is covered by an
    empty tmpfs and they are bind-mounted back, read-only."""
    parent: int | None = None
    """The pid of the worker process that started this supervisor."""
    shared_dirs: list[str] = field(default_factory=list)
    """Without namespaces: the host's world-writable folders, where what the call's uid
    keeps counts in its memory limit."""


@dataclass
class Report:
    """How the call ended, written as one JSON line to the report fd.

    ``outcome`` is ``exited`` (the snippet ended by itself), ``timeout``, ``memory`` or
    ``processes`` (a limit was passed), ``stopped`` (the worker asked), ``orphaned``
    (the worker process is gone) or ``failed`` (the snippet could not be started).
    """

    outcome: str = "exited"
    exit_code: int | None = None
    peak_memory: int = 0
    peak_processes: int = 0
    reason: dict[str, Any] = field(default_factory=dict)


_ANONYMOUS = ("/memfd:", "/dev/zero (deleted)", "/SYSV")
"""How ``/proc`` names a file that lives in memory without a name: a ``memfd_create``
file, a shared anonymous mapping, a System V segment (also any file ending in
``(deleted)``: one unlinked while still open or mapped)."""


def _private_resident(pid: int) -> int:
    """Resident memory of ``pid`` but its shared memory pages (``RssShmem``), which are
    counted once, with the file they belong to."""
    total = 0
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith((b"RssAnon:", b"RssFile:")):
                total += int(line.split()[1]) * 1024
    return total


def _anonymous(name: str) -> bool:
    return name.startswith(_ANONYMOUS) or name.endswith(" (deleted)")


def anonymous_files(pid: int, skip_dev: int | None, seen: dict[tuple[int, int], int]) -> None:
    """Add to ``seen`` (bytes by device and inode) the files without a name that ``pid``
    holds open or mapped, but those on device ``skip_dev`` (the call's tmpfs, counted as a
    whole) and System V segments (counted by :func:`sysv_shm`). A mapped file whose size
    this process may not read (``map_files`` needs root) counts the mapping's length."""
    with os.scandir(f"/proc/{pid}/fd") as fds:
        for fd in fds:
            try:
                name = os.readlink(fd.path)
                if not _anonymous(name) or name.startswith("/SYSV"):
                    continue
                st = os.stat(fd.path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_dev != skip_dev:
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) < 6 or not _anonymous(parts[5].rstrip("\n")):
                continue
            if parts[5].startswith("/SYSV"):
                continue
            span = parts[0]
            try:
                st = os.stat(f"/proc/{pid}/map_files/{span}")
            except OSError:
                start, end = (int(x, 16) for x in span.split("-"))
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                key = (os.makedev(major, minor), int(parts[4]))
                seen[key] = max(seen.get(key, 0), end - start)
                continue
            if st.st_dev != skip_dev:
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512


def sysv_shm(uid: int | None) -> int:
    """Bytes of the System V shared memory segments of this IPC namespace (of those
    ``uid`` created or owns, when given), resident or swapped."""
    total = 0
    try:
        with open("/proc/sysvipc/shm", encoding="ascii") as table:
            header = table.readline().split()
            for line in table:
                row = dict(zip(header, line.split(), strict=False))
                if uid is not None and str(uid) not in (row.get("uid"), row.get("cuid")):
                    continue
                total += int(row.get("rss", 0)) + int(row.get("swap", 0))
    except (OSError, ValueError):
        return total
    return total


def files_of(uid: int, folders: list[str]) -> int:
    """Bytes of what ``uid`` keeps in ``folders`` (the host's world-writable folders):
    each entry at their top it owns, a folder with all it holds."""
    total = 0
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != uid:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    for top, dirs, files in os.walk(entry.path):
                        for name in dirs + files:
                            with contextlib.suppress(OSError):
                                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                continue
    return total


def measure(root: psutil.Process, skip_dev: int | None = None) -> tuple[int, int]:
    """The memory of the live processes below ``root`` and their number: each one's
    resident memory but its shared memory pages, plus once each file without a name they
    hold open or mapped (a ``memfd_create`` file, a shared anonymous mapping, an unlinked
    file), but those on device ``skip_dev``."""
    memory = count = 0
    anonymous: dict[tuple[int, int], int] = {}
    for proc in root.children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            memory += _private_resident(proc.pid)
            anonymous_files(proc.pid, skip_dev, anonymous)
            count += 1
        except (psutil.Error, OSError):
            continue
    return memory + sum(anonymous.values()), count


def processes_of(uid: int) -> int:
    """How many tasks the real user ``uid`` has now: what ``RLIMIT_NPROC`` counts, which on
    Linux is threads, not processes (a worker of a thread pool has dozens)."""
    count = 0
    for proc in psutil.process_iter():
        try:
            if proc.uids().real == uid:
                count += proc.num_threads()
        except psutil.Error:
            continue
    return count


def child_limits(config: Config) -> Callable[[], None]:
    """The rlimits (and no new privileges) the snippet starts with, applied in the child
    before exec. Counted here, where this process sees all of the user's processes."""
    uid = config.uid if config.uid is not None else os.getuid()
    # RLIMIT_NPROC counts every thread of the user (root is exempt): a backstop that
    # stops a fork bomb faster than the poll can: twice the call's limit above the
    # threads the user has now, so the poll normally sees the limit passed first.
    nproc = processes_of(uid) + 2 * config.max_processes if uid != 0 else None

    def apply() -> None:
        memory = config.memory_limit
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # No POSIX message queue: on a shared IPC namespace one would outlive the call.
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        set_no_new_privs()

    return apply


def _start_snippet(
    config: Config, script: str, cwd: str, limits: Callable[[], None]
) -> subprocess.Popen[bytes]:
    drop = config.uid is not None and config.uid != os.geteuid()
    return subprocess.Popen(
        [config.python, "-I", script],
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=config.env,
        close_fds=True,
        start_new_session=True,
        user=config.uid if drop else None,
        group=config.gid if drop else None,
        extra_groups=[] if drop else None,
        preexec_fn=limits,
    )


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as out:
        out.write(text)


def enter_namespaces(call_dir: str, size: int) -> None:
    """Move this process into new mount and IPC namespaces, its next child into a new pid
    namespace (and, when not root, all of them into a new user namespace where this
    process keeps its uid and gid), and mount a tmpfs of ``size`` bytes on ``call_dir``,
    private to these namespaces.

    Raises:
        OSError: the kernel (or the container's policy) refuses one of these.
    """
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
    unshare(flags | (CLONE_NEWUSER if uid != 0 else 0))
    if uid != 0:
        # /proc/self of a non-dumpable process is root's: dumpable for these three writes
        # (no process of another call can see this one, and it holds no secret).
        _prctl(_PR_SET_DUMPABLE, 1)
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        finally:
            make_undumpable()
    mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    mount("toolfleet-call", call_dir, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size},mode=0700")


def tmpfs_used(path: str) -> int:
    """Bytes in use on the file system at ``path``."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without those inside another of them."""
    kept = sorted({os.path.normpath(p) for p in paths})
    return [p for p in kept if not any(q != p and p.startswith(q.rstrip("/") + "/") for q in kept)]


def _open_path_to(path: str) -> list[str]:
    """Make every folder above ``path`` enterable by any user in this mount namespace: a
    folder closed to others is covered by an empty tmpfs (mode 0755), and folders missing
    below such a cover are made. Returns the covers."""
    covers = []
    current = "/"
    for part in path.strip("/").split("/")[:-1]:
        current = os.path.join(current, part)
        if not os.path.isdir(current):
            os.mkdir(current, 0o755)
        elif not os.stat(current).st_mode & stat.S_IXOTH:
            mount("toolfleet-reach", current, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
            covers.append(current)
    if not os.path.isdir(path):
        os.mkdir(path, 0o755)
    return covers


def _bind_read_only(source: str, target: str) -> None:
    mount(source, target, None, _MS_BIND | _MS_REC)
    _remount_read_only(target)


def _mount_points() -> list[str]:
    """The mount points of this mount namespace, parents first (``/proc/self/mountinfo``,
    its octal escapes undone)."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
        for line in info:
            raw = line.split()[4]
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), raw))
    return sorted(set(points), key=lambda p: p.count("/") if p != "/" else 0)


def read_only_host(keep: str) -> None:
    """Remount every mount of this mount namespace read-only but ``keep`` (the call's
    tmpfs): no folder of the host, world-writable or the worker's own, takes a write
    from the call, nor keeps one past it. A mount point hidden by a later mount on a
    folder above it (``ENOENT``, ``EINVAL``) is out of reach anyway.

    Raises:
        OSError: a mount the call could reach refused to become read-only.
    """
    for point in _mount_points():
        if point == keep or point.startswith(keep.rstrip("/") + "/"):
            continue
        try:
            _remount_read_only(point)
        except OSError as exc:
            if exc.errno not in (errnos.ENOENT, errnos.EINVAL, errnos.ENOTDIR):
                raise


def _remount_read_only(target: str) -> None:
    # A remount must keep the flags a user namespace may not change (nosuid, nodev,
    # noexec, atime); statvfs's ST_* values are MS_* but for relatime.
    have = os.statvfs(target).f_flag
    kept = have & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
    kept |= _MS_RELATIME if have & os.ST_RELATIME else 0
    mount("none", target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | kept)


def _call_init(config: Config, life_fd: int, limits: Callable[[], None]) -> int:
    """The first process of the call's pid namespace: build the snippet's mount namespace,
    run the snippet, wait for it (and reap what it leaves), and return its exit code."""
    set_parent_death_signal(signal.SIGKILL)
    if select.select([life_fd], [], [], 0)[0]:  # the supervisor died before the line above
        raise OSError(errnos.ESRCH, "the supervisor is gone")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    make_undumpable()
    call_dir = config.call_dir
    assert call_dir is not None
    unshare(CLONE_NEWNS)
    mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    # Sources relative to the tmpfs's root: once it is under the private /tmp, its path
    # leads nowhere.
    os.chdir(call_dir)
    views = []
    for i, path in enumerate(_outermost(config.reach)):
        view = os.path.join("reach", str(i))
        os.makedirs(view)
        mount(path, view, None, _MS_BIND | _MS_REC)
        views.append((path, view))
    read_only_host(call_dir)
    for name, target in TMPFS_FOLDERS.items():
        if os.path.isdir(target) and not os.path.islink(target):
            mount(name, target, None, _MS_BIND)
    covers = []
    for path, view in views:
        covers += _open_path_to(path)
        _bind_read_only(view, path)
    for cover in covers:
        _remount_read_only(cover)
    mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    snippet = _start_snippet(config, config.script, config.cwd, limits)
    while True:
        pid, status = os.wait()
        if pid == snippet.pid:
            snippet.returncode = os.waitstatus_to_exitcode(status)  # reaped here
            return snippet.returncode


def _prepare_tmpfs(config: Config, code: bytes) -> None:
    """The call's tmpfs: a folder for each of ``TMPFS_FOLDERS`` (mode 1777), the script
    and the working directory (the snippet's) in ``tmp``."""
    assert config.call_dir is not None
    for name in TMPFS_FOLDERS:
        folder = os.path.join(config.call_dir, name)
        os.mkdir(folder)
        os.chmod(folder, 0o1777)
    tmp = os.path.join(config.call_dir, "tmp")
    script = os.path.join(tmp, os.path.basename(config.script))
    with open(script, "wb") as out:
        out.write(code)
    os.chmod(script, 0o644)
    work = os.path.join(tmp, os.path.basename(config.cwd))
    os.mkdir(work, 0o700)
    if config.uid is not None and os.geteuid() == 0:
        os.chown(work, config.uid, config.gid if config.gid is not None else -1)


@dataclass
class _Call:
    """What the supervisor watches: the process whose end ends the call, the root of the
    tree to measure, and (with namespaces) the init's report pipe and the call's tmpfs."""

    main: int
    tree: psutil.Process
    report_fd: int = -1
    tmpfs: str | None = None
    keep: list[int] = field(default_factory=list)
    snippet: subprocess.Popen[bytes] | None = None
    """The snippet's Popen, held: dropped, its finalizer polls the snippet and reaps it if it
    has ended already, and :func:`reap_children` would never see it end."""

    @property
    def tmpfs_dev(self) -> int | None:
        return os.stat(self.tmpfs).st_dev if self.tmpfs is not None else None


def _start(config: Config) -> _Call:
    limits = child_limits(config)
    if not config.namespaces:
        snippet = _start_snippet(config, config.script, config.cwd, limits)
        return _Call(snippet.pid, psutil.Process(), snippet=snippet)
    assert config.call_dir is not None
    code = sys.stdin.buffer.read()
    enter_namespaces(config.call_dir, config.memory_limit)
    _prepare_tmpfs(config, code)
    life_r, life_w = os.pipe()
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the init, in the call's pid namespace
        status = 1
        try:
            os.close(life_w)
            os.close(report_r)
            os.close(config.report_fd)
            message: dict[str, Any] = {"exit_code": _call_init(config, life_r, limits)}
            status = 0
        except BaseException as exc:  # reported, then this process ends
            message = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(report_w, json.dumps(message).encode())
        finally:
            os._exit(status)
    os.close(life_r)
    os.close(report_w)
    os.set_blocking(report_r, False)
    return _Call(pid, psutil.Process(pid), report_r, config.call_dir, keep=[life_w])


def _init_report(call: _Call) -> dict[str, Any]:
    try:
        data = os.read(call.report_fd, 65536)
        return dict(json.loads(data)) if data else {}
    except (OSError, ValueError):
        return {}


def supervise(config: Config) -> Report:
    """Run the snippet of ``config`` to its end and leave no process of it behind."""
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    parent = config.parent if config.parent is not None else os.getppid()
    report = Report()
    try:
        call = _start(config)
    except OSError as exc:
        kill_tree()
        return Report(outcome="failed", reason={"error": f"{type(exc).__name__}: {exc}"})
    deadline = time.monotonic() + config.timeout
    try:
        while True:
            reaped = reap_children()
            if call.main in reaped:
                if call.tmpfs is None:
                    report.exit_code = reaped[call.main]
                    break
                told = _init_report(call)
                if "error" in told:
                    report.outcome = "failed"
                    report.reason = {"error": told["error"]}
                report.exit_code = told.get("exit_code")
                break
            memory, count = measure(call.tree, call.tmpfs_dev)
            if call.tmpfs is not None:
                memory += tmpfs_used(call.tmpfs) + sysv_shm(None)
            elif config.uid is not None:
                memory += files_of(config.uid, config.shared_dirs) + sysv_shm(config.uid)
            report.peak_memory = max(report.peak_memory, memory)
            report.peak_processes = max(report.peak_processes, count)
            if memory > config.memory_limit:
                report.outcome = "memory"
                report.reason = {"memory": memory}
                break
            if count > config.max_processes:
                report.outcome = "processes"
                report.reason = {"processes": count}
                break
            if time.monotonic() >= deadline:
                report.outcome = "timeout"
                break
            if os.getppid() != parent:  # before stop: its death also sends SIGTERM
                report.outcome = "orphaned"
                break
            if stop:
                report.outcome = "stopped"
                break
            time.sleep(POLL_INTERVAL)
    finally:
        reaped = kill_tree()
        if report.exit_code is None and call.tmpfs is None and call.main in reaped:
            report.exit_code = reaped[call.main]
        elif report.exit_code is None and report.outcome not in ("exited", "failed"):
            report.exit_code = -signal.SIGKILL  # the snippet, killed with its init
    return report


def probe(call_dir: str) -> str | None:
    """Whether this process can run a call in namespaces of its own (on ``call_dir``, an
    empty folder): ``None`` when it can, else the refusal of the step that failed."""
    try:
        enter_namespaces(call_dir, 2**20)
    except OSError as exc:
        return str(exc)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe's init
        try:
            set_parent_death_signal(signal.SIGKILL)
            unshare(CLONE_NEWNS)
            mount("none", "/", None, _MS_REC | _MS_PRIVATE)
            mount(call_dir, "/tmp", None, _MS_BIND)
            read_only_host("/tmp")
            mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except OSError as exc:
            os.write(2, str(exc).encode())
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else "the call's init failed"


def main(argv: list[str]) -> int:
    """Entry point: ``python -s -P supervisor.py CONFIG_JSON`` (or ``--probe DIR``)."""
    make_undumpable()
    if argv[1] == "--probe":
        print(json.dumps({"refused": probe(argv[2])}))
        return 0
    config = Config(**json.loads(argv[1]))
    # SIGTERM (a stop) when the worker's process dies; if it died already, stop at once.
    set_parent_death_signal(signal.SIGTERM)
    set_child_subreaper()
    report = supervise(config)
    with os.fdopen(config.report_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(asdict(report)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
