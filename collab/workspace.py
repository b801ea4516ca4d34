"""Read-only access to a project's workspace directory for explorer agents.

``Workspace`` confines read / list / glob / grep to one directory on the worker
machine: every path is resolved (symlinks included) and refused unless it stays
inside the root. ``grep`` patterns are untrusted: they run on RE2, a linear-time
engine, never on Python's backtracking ``re``. ``check_workspace_path`` decides which
directories may be a workspace. Shell commands run in the sandbox (``collab.sandbox``).

Errors are ``WorkspaceError(code, detail)``; the tool adapters render them.
Every answer passes the text boundary (``collab.text``): a file name that is not
UTF-8 (Python hands it over with surrogate escapes), a NUL in a file become U+FFFD,
so an explorer never stores what PostgreSQL refuses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath

import re2
from django.conf import settings

from collab.text import clean_text

MAX_READ_BYTES = 5 * 1024 * 1024
MAX_OUTPUT_CHARS = 30_000
MAX_LINE_CHARS = 2000
MAX_GREP_LINE_CHARS = 500
MAX_LIST_ENTRIES = 1000
MAX_GLOB_RESULTS = 500
MAX_GREP_MATCHES = 1000
BINARY_SNIFF_BYTES = 8192
RE2_MAX_MEM = 64 * 1024 * 1024  # a pattern whose automaton needs more is refused, not built


class WorkspaceError(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class Workspace:
    """A directory that agents may read but not leave."""

    def __init__(self, root: str | os.PathLike):
        real = Path(os.path.realpath(root))
        if not real.is_dir():
            raise WorkspaceError("workspace_unavailable", f"workspace directory {os.fspath(root)} does not exist")
        try:
            check_workspace_path(real)  # a workspace set before the rule existed is not served either
        except WorkspaceError as exc:
            raise WorkspaceError("workspace_unavailable", exc.detail) from None
        self.root = real

    def resolve(self, path: str) -> Path:
        """Return the real path of ``path`` (relative to the root, or absolute), refusing anything outside the root."""
        if "\0" in path:
            raise WorkspaceError("invalid_path", "path contains a NUL byte")
        real = Path(os.path.realpath(self.root / path))  # joining an absolute path keeps it as is
        if not real.is_relative_to(self.root):
            raise WorkspaceError("path_outside_workspace", f"{path} is outside the workspace {self.root}")
        return real

    def read(self, path: str, offset: int = 1, limit: int = 2000) -> str:
        """Lines ``offset`` .. ``offset + limit - 1`` of a text file, numbered like ``cat -n``."""
        if offset < 1 or limit < 1:
            raise WorkspaceError("invalid_arguments", "offset and limit must be at least 1")
        target = self.resolve(path)
        if target.is_dir():
            raise WorkspaceError("is_a_directory", f"{path} is a directory: use list")
        lines = _text_lines(target, path)
        total = len(lines)
        if offset > total:
            return f"(no lines: offset {offset} is past the end of {path}, which has {total} lines)"
        out: list[str] = []
        size = 0
        last = offset - 1
        for number in range(offset, min(offset + limit, total + 1)):
            line = lines[number - 1]
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + " […]"
            entry = f"{number:>6}\t{line}"
            if size + len(entry) + 1 > MAX_OUTPUT_CHARS:
                out.append("[… truncated: use offset/limit]")
                break
            out.append(entry)
            size += len(entry) + 1
            last = number
        out.append(f"(lines {offset}–{last} of {total})")
        return clean_text("\n".join(out))

    def list(self, path: str = ".") -> str:
        """The directory's entries, sorted; symlinks are shown, not followed."""
        target = self._directory(path)
        entries = []
        for entry in sorted(os.scandir(target), key=lambda e: e.name):
            if entry.is_symlink():
                entries.append(f"{entry.name} -> {os.readlink(entry.path)}")
            elif entry.is_dir(follow_symlinks=False):
                entries.append(f"{entry.name}/")
            else:
                entries.append(entry.name)
        if not entries:
            return "(empty directory)"
        return _bounded(entries[:MAX_LIST_ENTRIES], len(entries))

    def glob(self, pattern: str, path: str = ".") -> str:
        """Files under ``path`` matching a pathlib pattern (``**/*.py``), relative to the root, outside ``.git``."""
        parts = PurePosixPath(pattern).parts
        if not pattern or "\0" in pattern or pattern.startswith("/") or ".." in parts:
            raise WorkspaceError("invalid_pattern", "the pattern must be relative and must not contain '..'")
        base = self._directory(path)
        try:
            found = sorted(
                str(match.relative_to(self.root))
                for match in base.glob(pattern)
                if ".git" not in match.relative_to(base).parts and self._is_inside_file(match)
            )
        except ValueError as error:
            raise WorkspaceError("invalid_pattern", str(error)) from None
        if not found:
            return "no files match"
        return _bounded(found[:MAX_GLOB_RESULTS], len(found))

    def grep(
        self,
        pattern: str,
        path: str = ".",
        glob: str | None = None,
        ignore_case: bool = False,
        max_matches: int = 200,
    ) -> str:
        """Lines matching a regular expression (RE2 syntax), as ``relpath:lineno: line``.

        Skips ``.git``, binary and oversized files and symlinks leaving the root.
        ``glob`` filters file paths from the right like ``PurePath.match`` (``*.py``, ``src/*.py``).
        """
        if max_matches < 1:
            raise WorkspaceError("invalid_arguments", "max_matches must be at least 1")
        max_matches = min(max_matches, MAX_GREP_MATCHES)
        regex = compile_pattern(pattern, ignore_case=ignore_case)
        while glob and glob.startswith("**/"):  # match() already anchors at any depth
            glob = glob[3:]
        matches: list[str] = []
        total = 0
        for file in self._walk_files(self.resolve(path)):
            relative = file.relative_to(self.root)
            if glob and not relative.match(glob):
                continue
            try:
                lines = _text_lines(file, str(relative))
            except (WorkspaceError, OSError):
                continue
            for number, line in enumerate(lines, 1):
                if regex.search(line):
                    total += 1
                    if len(matches) < max_matches:
                        matches.append(f"{relative}:{number}: {line[:MAX_GREP_LINE_CHARS]}")
        if not matches:
            return "no matches"
        return _bounded(matches, total)

    def _directory(self, path: str) -> Path:
        target = self.resolve(path)
        if not target.exists():
            raise WorkspaceError("not_found", f"{path} does not exist")
        if not target.is_dir():
            raise WorkspaceError("not_a_directory", f"{path} is not a directory")
        return target

    def _is_inside_file(self, path: Path) -> bool:
        real = Path(os.path.realpath(path))
        return real.is_relative_to(self.root) and real.is_file()

    def _walk_files(self, base: Path):
        """Files under ``base`` (or ``base`` itself), in sorted order, without entering ``.git`` or symlinked dirs."""
        if base.is_file():
            yield base
            return
        for directory, subdirs, files in os.walk(base):
            subdirs[:] = sorted(d for d in subdirs if d != ".git")
            for name in sorted(files):
                file = Path(directory, name)
                if self._is_inside_file(file):
                    yield file


def compile_pattern(pattern: str, *, ignore_case: bool = False):
    """An untrusted regular expression compiled by RE2: matching takes time linear in the text,
    whatever the pattern, so no pattern can hold a process. What RE2 cannot do in
    linear time (backreferences, lookaround) is refused with ``invalid_pattern``; there is no
    fallback to Python's backtracking ``re``."""
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.max_mem = RE2_MAX_MEM
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else ""
        reason = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise WorkspaceError(
            "invalid_pattern",
            f"invalid or unsupported regular expression ({reason}); patterns use RE2 syntax: "
            "no backreferences, no lookahead or lookbehind",
        ) from None


def protected_paths() -> list[Path]:
    """Trellis's own files, never a workspace and never visible in the sandbox: the code and its
    settings (BASE_DIR), the data directory, the database files and the Python environment."""
    paths = [Path(settings.BASE_DIR), Path(settings.VAR_DIR), Path(sys.prefix)]
    for db in settings.DATABASES.values():
        if db.get("ENGINE", "").endswith("sqlite3"):
            for name in (db.get("NAME"), (db.get("TEST") or {}).get("NAME")):
                if name and str(name) != ":memory:" and not str(name).startswith("file:"):
                    paths.append(Path(name).parent)
    return sorted({Path(os.path.realpath(p)) for p in paths})


def check_workspace_path(path: str | os.PathLike) -> Path:
    """The real path of a directory that may be a project's workspace, else
    ``WorkspaceError("invalid_workspace")``: it must exist and be a directory, not be the
    filesystem root, and neither contain nor lie inside one of ``protected_paths()``."""
    raw = os.fspath(path).strip()
    if not raw or "\0" in raw:
        raise WorkspaceError("invalid_workspace", "the workspace must be a directory path")
    real = Path(os.path.realpath(Path(raw).expanduser()))
    if not real.is_dir():
        raise WorkspaceError("invalid_workspace", f"{raw!r} is not a directory on this machine")
    if real == Path(real.anchor):
        raise WorkspaceError("invalid_workspace", "the filesystem root cannot be a workspace")
    for own in protected_paths():
        if real.is_relative_to(own) or own.is_relative_to(real):
            raise WorkspaceError(
                "invalid_workspace",
                f"{raw!r} would expose Trellis's own files ({own}): choose a directory that neither "
                "contains nor lies inside them",
            )
    return real


def open_workspace(root: str | None) -> Workspace | None:
    """The project's workspace, or None when it has none configured."""
    return Workspace(root) if root else None


def _text_lines(file: Path, shown: str) -> list[str]:
    """The lines of a text file, refusing missing, special, oversized and binary files."""
    if not file.exists():
        raise WorkspaceError("not_found", f"{shown} does not exist")
    if not file.is_file():
        raise WorkspaceError("invalid_path", f"{shown} is not a regular file")
    size = file.stat().st_size
    if size > MAX_READ_BYTES:
        raise WorkspaceError("file_too_large", f"{shown} is {size} bytes; the limit is {MAX_READ_BYTES}")
    data = file.read_bytes()
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        raise WorkspaceError("binary_file", f"{shown} is a binary file")
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _bounded(lines: list[str], total: int) -> str:
    """Join ``lines`` (the first of ``total``) within MAX_OUTPUT_CHARS, noting how many were left out.
    A listing is cut at whole entries with a count the model can page on, not head+tail like free
    text (``collab.text.bound_text``, which bounds the tool's whole answer after this)."""
    out: list[str] = []
    size = 0
    for line in lines:
        if size + len(line) + 1 > MAX_OUTPUT_CHARS:
            break
        out.append(line)
        size += len(line) + 1
    if len(out) < total:
        out.append(f"[… {total - len(out)} more]")
    return clean_text("\n".join(out))
