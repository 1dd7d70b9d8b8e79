"""File tools confined to one workspace directory: read, list, search and write.

Every path a model passes is taken relative to the workspace root and checked by
:func:`resolve_in_root` before it is used, so ``..``, absolute paths elsewhere and symlinks
pointing out of the root are refused. The check runs before each operation and is not
atomic with it: another process that swaps a symlink in between can still escape. The
confinement keeps a model's mistakes inside the workspace; it is not a security boundary.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO

import regex
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

__all__ = ["resolve_in_root", "workspace_tools"]

MAX_LIST_ENTRIES = 500
MAX_LINE_CHARS = 2000
MAX_GREP_FILE_BYTES = 5_000_000
DEFAULT_MAX_READ_BYTES = 1_000_000
"""Most bytes of a file one ``read_file`` call reads into memory and returns."""
GREP_MATCH_SECONDS = 5.0
"""Matching time one ``grep`` call may spend: a catastrophic pattern stops there, on any
pool (the threads pool ignores time limits)."""
# A line is read at most this far (UTF-8 takes up to 4 bytes a character); the rest of a
# longer line is skipped, never held in memory.
_MAX_LINE_BYTES = 4 * MAX_LINE_CHARS
_SNIFF_BYTES = 8192
# Version-control metadata and bytecode caches are noise in nearly every search.
_GREP_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__"})


def resolve_in_root(root: Path, path: str) -> Path:
    """Resolve ``path`` against ``root`` and refuse it if it lands outside the root.

    Args:
        root: The workspace root, already resolved (absolute, no symlinks).
        path: A path relative to the root, or an absolute path inside it.

    Returns:
        The resolved absolute path, with every existing symlink followed.

    Raises:
        ValueError: the path resolves outside the root.
    """
    resolved = (root / path).resolve()
    if resolved != root and not resolved.is_relative_to(root):
        raise ValueError(f"{path!r} is outside the workspace root")
    return resolved


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


def _is_binary(path: Path) -> bool:
    with path.open("rb") as f:
        return b"\0" in f.read(_SNIFF_BYTES)


def _clip(line: str, limit: int = MAX_LINE_CHARS) -> str:
    return line if len(line) <= limit else f"{line[:limit]}... [line cut at {limit} chars]"


def _lines(f: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """Each line's first bytes (at most ``_MAX_LINE_BYTES``) and its full length."""
    while head := f.readline(_MAX_LINE_BYTES):
        size, tail = len(head), head
        while not tail.endswith(b"\n") and (tail := f.readline(_MAX_LINE_BYTES)):
            size += len(tail)
        yield head, size


def _walk(top: Path) -> Iterator[Path]:
    """Every file under ``top`` in a stable order, not descending into symlinked dirs."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in _GREP_SKIP_DIRS)
        for name in sorted(filenames):
            yield Path(dirpath, name)


class ReadFileArgs(BaseModel):
    path: str = Field(description="File path relative to the workspace root.")
    offset: int = Field(default=0, ge=0, description="Lines to skip from the start (0-based).")
    limit: int = Field(default=2000, ge=1, description="Most lines to return.")


class ListDirArgs(BaseModel):
    path: str = Field(default=".", description="Directory relative to the workspace root.")


class GrepArgs(BaseModel):
    pattern: str = Field(description="Python regular expression searched for in each line.")
    path: str = Field(
        default=".", description="File or directory to search, relative to the workspace root."
    )
    glob: str | None = Field(
        default=None,
        description="Only search files whose name matches this shell pattern, e.g. '*.py'. "
        "A pattern containing '/' is matched against the path from the workspace root.",
    )
    max_matches: int = Field(default=200, ge=1, le=5000, description="Stop after this many.")


class WriteFileArgs(BaseModel):
    path: str = Field(description="File path relative to the workspace root.")
    content: str = Field(description="The complete new text of the file (UTF-8).")


def workspace_tools(
    root: Path,
    *,
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
    grep_seconds: float = GREP_MATCH_SECONDS,
) -> list[BaseTool]:
    """Build the workspace tools ``read_file``, ``list_dir``, ``grep`` and ``write_file``.

    Args:
        root: The workspace root; it must exist. It is resolved here.
        max_read_bytes: Most bytes of a file one ``read_file`` call reads and returns.
        grep_seconds: Matching time one ``grep`` call may spend.

    Returns:
        The four tools, each confined to ``root``.
    """
    root = root.resolve(strict=True)

    def read_file(path: str, offset: int = 0, limit: int = 2000) -> str:
        target = resolve_in_root(root, path)
        if target.is_dir():
            raise IsADirectoryError(f"{path!r} is a directory; use list_dir to see it")
        if not target.is_file():
            raise FileNotFoundError(f"no file {path!r} in the workspace")
        if _is_binary(target):
            return (
                f"{_rel(root, target)} looks like a binary file ({target.stat().st_size} "
                "bytes); read_file only shows text files."
            )
        shown: list[str] = []
        budget = max_read_bytes
        seen = 0
        with target.open("rb") as f:
            for seen, (head, size) in enumerate(_lines(f), start=1):
                if seen <= offset:
                    continue
                capped = len(head) > budget and bool(shown)
                if len(shown) == limit or capped:
                    end = seen - 1
                    cause = f" (read_file's cap is {max_read_bytes} bytes)" if capped else ""
                    shown.append(
                        f"[lines {offset + 1}-{end} shown{cause}; the file continues: "
                        f"call read_file with offset={end} to read more]"
                    )
                    return "\n".join(shown)
                budget -= min(len(head), budget)
                line = head.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r")
                if size > len(head) or len(line) > MAX_LINE_CHARS:
                    line = f"{line[:MAX_LINE_CHARS]}... [line cut at {MAX_LINE_CHARS} chars]"
                shown.append(f"{seen:6}\t{line}")
        if not shown:
            if seen == 0:
                return f"{_rel(root, target)} is empty."
            return f"{_rel(root, target)} has {seen} lines; offset {offset} is past the end."
        return "\n".join(shown)

    def list_dir(path: str = ".") -> str:
        target = resolve_in_root(root, path)
        if not target.is_dir():
            raise NotADirectoryError(f"{path!r} is not a directory in the workspace")
        with os.scandir(target) as it:
            entries = sorted(it, key=lambda e: e.name)
        if not entries:
            return f"{_rel(root, target)} is empty."
        lines = [f"{'type':<4}  {'bytes':>12}  name"]
        for entry in entries[:MAX_LIST_ENTRIES]:
            # Symlinks are not followed: one may point outside the root.
            if entry.is_symlink():
                lines.append(f"link  {'-':>12}  {entry.name} -> {os.readlink(entry.path)}")
            elif entry.is_dir():
                lines.append(f"dir   {'-':>12}  {entry.name}/")
            else:
                lines.append(f"file  {entry.stat().st_size:>12}  {entry.name}")
        if len(entries) > MAX_LIST_ENTRIES:
            lines.append(f"[{MAX_LIST_ENTRIES} of {len(entries)} entries shown]")
        return "\n".join(lines)

    def _files_under(target: Path, glob: str | None) -> Iterator[tuple[str, Path]]:
        """(path shown to the model, resolved path) of every file to search."""
        for file in [target] if target.is_file() else _walk(target):
            rel = _rel(root, file)
            if glob is not None and not fnmatch(rel if "/" in glob else file.name, glob):
                continue
            try:
                # A symlinked file may lead out of the root; skip it rather than fail.
                resolved = resolve_in_root(root, rel)
            except ValueError:
                continue
            if resolved.is_file():
                yield rel, resolved

    def grep(pattern: str, path: str = ".", glob: str | None = None, max_matches: int = 200) -> str:
        try:
            # The regex package (re's syntax) can stop a match that runs too long.
            compiled = regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(
                f"invalid regular expression {pattern!r}: {exc}. The pattern is Python `re` "
                "syntax; escape special characters such as ( [ . * + ? with a backslash."
            ) from exc
        target = resolve_in_root(root, path)
        if not target.exists():
            raise FileNotFoundError(f"no file or directory {path!r} in the workspace")
        matches: list[str] = []
        skipped = 0
        deadline = time.monotonic() + grep_seconds
        for rel, file in _files_under(target, glob):
            if file.stat().st_size > MAX_GREP_FILE_BYTES or _is_binary(file):
                skipped += 1
                continue
            with file.open(encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, start=1):
                    try:
                        found = compiled.search(line, timeout=max(deadline - time.monotonic(), 0))
                    except TimeoutError:
                        # Not a TimeoutError out of the tool: policies retry those.
                        raise ValueError(
                            f"the pattern {pattern!r} took more than {grep_seconds:g} s to "
                            f"match (in {rel}, line {lineno}); nested repetition such as "
                            "(a+)+ backtracks without end: simplify the pattern"
                        ) from None
                    if not found:
                        continue
                    matches.append(f"{rel}:{lineno}: {_clip(line.rstrip(), 500)}")
                    if len(matches) == max_matches:
                        matches.append(f"[stopped after {max_matches} matches]")
                        return "\n".join(matches)
        if not matches:
            matches.append(f"no matches for {pattern!r} under {_rel(root, target)}")
        if skipped:
            matches.append(f"[{skipped} binary or large files skipped]")
        return "\n".join(matches)

    def write_file(path: str, content: str) -> str:
        target = resolve_in_root(root, path)
        if target == root or target.is_dir():
            raise IsADirectoryError(f"{path!r} is a directory; give a file path")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        # mkstemp creates the file 0600; keep the old file's mode or use a normal one.
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            # Readers see the old file or the new one, never a half-written one.
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return f"wrote {len(data)} bytes to {_rel(root, target)}"

    return [
        StructuredTool.from_function(
            read_file,
            name="read_file",
            description="Read a text file in the workspace. Returns numbered lines like "
            "`cat -n`; use offset and limit to page through long files.",
            args_schema=ReadFileArgs,
        ),
        StructuredTool.from_function(
            list_dir,
            name="list_dir",
            description="List a workspace directory: each entry's type (dir/file/link), "
            f"size in bytes and name, sorted by name, at most {MAX_LIST_ENTRIES} entries.",
            args_schema=ListDirArgs,
        ),
        StructuredTool.from_function(
            grep,
            name="grep",
            description="Search text files under a workspace path for a regular expression. "
            "Returns one `path:line_number: line` per matching line.",
            args_schema=GrepArgs,
        ),
        StructuredTool.from_function(
            write_file,
            name="write_file",
            description="Create or overwrite a text file in the workspace with the given "
            "content, creating missing parent directories. Returns the bytes written.",
            args_schema=WriteFileArgs,
        ),
    ]
