"""Read-only access to a project's workspace directory for explorer agents.

``Workspace`` confines read / list / glob / grep to one directory on the worker
machine: every path is resolved (symlinks included) and refused unless it stays
inside the root. ``run_bash`` runs a shell command under bubblewrap with the
workspace mounted read-only, a private ``/tmp``, no network, an empty
environment and no capabilities; it never runs a command unsandboxed.

Errors are ``WorkspaceError(code, detail)``; the tool adapters render them.
Every answer passes the text boundary (``collab.text``): a file name that is not
UTF-8 (Python hands it over with surrogate escapes), a NUL in a file or in a
command's output become U+FFFD, so an explorer never stores what PostgreSQL refuses.
"""

from __future__ import annotations

import codecs
import functools
import os
import resource
import re
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from collab.text import clean_text

MAX_READ_BYTES = 5 * 1024 * 1024
MAX_OUTPUT_CHARS = 30_000
MAX_LINE_CHARS = 2000
MAX_GREP_LINE_CHARS = 500
MAX_LIST_ENTRIES = 1000
MAX_GLOB_RESULTS = 500
MAX_GREP_MATCHES = 1000
BINARY_SNIFF_BYTES = 8192
MIN_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 600_000

SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
# Preferred first; the fallback is for hosts where bwrap cannot create a user namespace.
UNSHARE_CHOICES = (("--unshare-all",), ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"))
PROBE_TIMEOUT_S = 10
KILL_GRACE_S = 2


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
        """Lines matching a Python regex, as ``relpath:lineno: line``.

        Skips ``.git``, binary and oversized files and symlinks leaving the root.
        ``glob`` filters file paths from the right like ``PurePath.match`` (``*.py``, ``src/*.py``).
        """
        if max_matches < 1:
            raise WorkspaceError("invalid_arguments", "max_matches must be at least 1")
        max_matches = min(max_matches, MAX_GREP_MATCHES)
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as error:
            raise WorkspaceError("invalid_pattern", f"invalid regular expression: {error}") from None
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
    """Join ``lines`` (the first of ``total``) within MAX_OUTPUT_CHARS, noting how many were left out."""
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


# --- bash under bubblewrap ------------------------------------------------------


@dataclass
class BashResult:
    exit_code: int | None
    output: str
    timed_out: bool
    timeout_ms: int = 0

    def as_text(self) -> str:
        status = f"timed out after {self.timeout_ms} ms" if self.timed_out else f"exit code {self.exit_code}"
        return clean_text(f"{status}\n{self.output}")


@dataclass(frozen=True)
class _Sandbox:
    available: bool
    reason: str
    argv: tuple[str, ...] = ()


def sandbox_status() -> tuple[bool, str]:
    """Whether ``run_bash`` can be offered, and if not, why."""
    sandbox = _probe()
    return sandbox.available, sandbox.reason


@functools.cache
def _probe() -> _Sandbox:
    """Find bwrap and the strongest namespace isolation that actually starts here (once per process)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _Sandbox(False, "bubblewrap is not installed (no bwrap on PATH)")
    reason = ""
    for unshare in UNSHARE_CHOICES:
        argv = _sandbox_argv(bwrap, unshare)
        try:
            probe = subprocess.run(
                [*argv, "--", "/bin/true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            reason = f"bubblewrap could not start a sandbox: {error}"
            continue
        if probe.returncode == 0:
            return _Sandbox(True, "", tuple(argv))
        stderr = probe.stderr.decode(errors="replace").strip()
        reason = f"bubblewrap could not start a sandbox: {stderr or f'exit code {probe.returncode}'}"
    return _Sandbox(False, reason)


# What programs need from /etc: the loader, users, time zone, git's config, certificates.
ETC_ALLOWED = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf",
    "localtime", "gitconfig", "bash.bashrc", "inputrc", "ssl/certs", "ca-certificates", "magic", "mime.types",
)
TMP_BYTES = 256 * 1024 * 1024  # the private /tmp, and the largest file a command may write
MEMORY_BYTES = 4 * 1024 * 1024 * 1024  # address space per process


def _sandbox_argv(bwrap: str, unshare: tuple[str, ...]) -> list[str]:
    """bwrap options for a minimal read-only system: /usr and /etc, private /tmp, nothing else of the host."""
    argv = [bwrap, *unshare, "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        argv += ["--setenv", name, value]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/", name)
        if top.is_symlink():  # merged /usr: recreate the link
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    for entry in ETC_ALLOWED:  # not /etc wholesale: no shadow files, no service credentials
        argv += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    return argv


def _limit_resources() -> None:
    """In the child before exec: memory and file-size ceilings for everything in the sandbox."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (TMP_BYTES, TMP_BYTES))


def run_bash(workspace: Workspace, command: str, timeout_ms: int = 30_000) -> BashResult:
    """Run ``command`` with bash inside the sandbox, in the workspace root (mounted read-only).

    Output is stdout and stderr merged, capped to MAX_OUTPUT_CHARS (head and tail kept).
    On timeout the whole sandbox is killed and ``exit_code`` is None.
    """
    if not MIN_TIMEOUT_MS <= timeout_ms <= MAX_TIMEOUT_MS:
        raise WorkspaceError(
            "invalid_arguments", f"timeout_ms must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS}"
        )
    sandbox = _probe()
    if not sandbox.available:
        raise WorkspaceError("sandbox_unavailable", sandbox.reason)
    root = str(workspace.root)
    argv = [*sandbox.argv, "--ro-bind", root, root, "--chdir", root, "--", "/bin/bash", "-c", command]
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=_limit_resources,
    )
    output = _HeadTail((MAX_OUTPUT_CHARS - 100) // 2)
    finished = _pump(process, output, time.monotonic() + timeout_ms / 1000)
    if not finished:
        # bwrap is the group leader; --die-with-parent takes the sandbox's pid namespace down with it.
        os.killpg(process.pid, signal.SIGKILL)
        _pump(process, output, time.monotonic() + KILL_GRACE_S)
    process.stdout.close()
    exit_code = process.wait()
    return BashResult(
        exit_code=exit_code if finished else None, output=output.text(), timed_out=not finished, timeout_ms=timeout_ms
    )


def _pump(process: subprocess.Popen, output: _HeadTail, deadline: float) -> bool:
    """Copy the process's output into ``output`` until EOF (True) or the deadline (False)."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if not selector.select(remaining):
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                output.finish()
                return True
            output.feed(chunk)
    return False


class _HeadTail:
    """Decoded output keeping only the first and last ``keep`` characters, counting what falls between."""

    def __init__(self, keep: int):
        self.keep = keep
        self.head = ""
        self.tail = ""
        self.omitted = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self._add(self.decoder.decode(data))

    def finish(self) -> None:
        self._add(self.decoder.decode(b"", final=True))

    def _add(self, text: str) -> None:
        room = self.keep - len(self.head)
        self.head += text[:room]
        self.tail += text[room:] if room > 0 else text
        if len(self.tail) > self.keep:
            self.omitted += len(self.tail) - self.keep
            self.tail = self.tail[-self.keep :]

    def text(self) -> str:
        if not self.omitted:
            return self.head + self.tail
        return f"{self.head}\n[… {self.omitted} characters omitted …]\n{self.tail}"
