"""Read-only access to a project's workspace directory for explorer agents.

``Workspace`` confines read / list / glob / grep to one directory on the worker
machine: every path is resolved (symlinks included) and refused unless it stays
inside the root. ``grep`` patterns are untrusted: they run on RE2, a linear-time
engine, never on Python's backtracking ``re``. ``run_bash`` runs a shell
command under bubblewrap with the workspace mounted read-only, a private ``/tmp``,
no network, an empty environment, no capabilities, the parts of ``/usr`` programs
need and none of Trellis's own files, and with limits on processes, CPU seconds,
address space, file size and open files (docs/contract.md#the-openwork-toolset); it never runs a command
unsandboxed. ``check_workspace_path`` decides which directories may be a workspace.

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
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import re2
from django.conf import settings

from collab.text import BoundedStream, clean_text

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
RE2_MAX_MEM = 64 * 1024 * 1024  # a pattern whose automaton needs more is refused, not built

SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
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


# --- bash under bubblewrap ------------------------------------------------------


@dataclass
class BashResult:
    exit_code: int | None
    output: str
    timed_out: bool
    timeout_ms: int = 0
    process_limit_hit: bool = False  # some fork failed because the command had MAX_PROCESSES

    @property
    def failed(self) -> bool:
        return self.timed_out or self.exit_code != 0 or self.process_limit_hit

    def as_text(self) -> str:
        if self.timed_out:
            status = f"timed out after {self.timeout_ms} ms"
        else:
            status = f"exit code {self.exit_code}" + (f" ({note})" if (note := limit_note(self.exit_code)) else "")
        if self.process_limit_hit:
            status += f"; the process limit ({MAX_PROCESSES}) was reached and some processes could not start"
        return clean_text(f"{status}\n{self.output}")


# What a sandboxed command may use. Processes count every task of the command;
# the others are per process rlimits.
MAX_PROCESSES = 128
CPU_SECONDS = 60
MEMORY_BYTES = 2 * 1024 * 1024 * 1024  # address space, per process
OPEN_FILES = 256
# The whole writable space of a command: after set-up its root and /dev are read-only (SEALED),
# and what it may write is two sized tmpfs — /tmp (three quarters of the operator's ceiling,
# TRELLIS_SANDBOX_MEMORY_MB, also the largest file it may write) and /dev/shm (the rest). tmpfs
# pages are memory that no process limit counts; where the pids cgroup is a cgroup v2 one with
# the memory controller, the command's cgroup is also held to the ceiling (``memory.max``).
SEALED = ("--remount-ro", "/dev", "--remount-ro", "/")


def memory_bytes() -> int:
    return settings.TRELLIS_SANDBOX_MEMORY_MB * 1024 * 1024


def tmp_bytes() -> int:
    """The private /tmp's size, and the largest file a command may write."""
    return memory_bytes() * 3 // 4


def shm_bytes() -> int:
    return memory_bytes() - tmp_bytes()
CGROUP_V1_PIDS = "/sys/fs/cgroup/pids"


def limit_note(exit_code: int | None) -> str:
    """Why a command died, when a sandbox limit is the likely reason (bash reports 128 + signal)."""
    if exit_code is None or exit_code <= 128:
        return ""
    number = exit_code - 128
    if number == signal.SIGXCPU:
        return f"killed: CPU time limit reached (the sandbox allows {CPU_SECONDS} s per process)"
    if number == signal.SIGXFSZ:
        return f"killed: file size limit reached (the sandbox allows {tmp_bytes() // (1024 * 1024)} MiB per file)"
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return ""


@dataclass(frozen=True)
class _Sandbox:
    available: bool
    reason: str
    argv: tuple[str, ...] = ()
    cgroup_parent: str = ""  # a pids cgroup to create one child per command in; "" = RLIMIT_NPROC


def sandbox_status() -> tuple[bool, str]:
    """Whether ``run_bash`` can be offered, and if not, why."""
    sandbox = _probe()
    return sandbox.available, sandbox.reason


@functools.cache
def _probe() -> _Sandbox:
    """Find bwrap, the strongest namespace isolation that actually starts here, and a way to
    bound the number of processes (once per process)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _Sandbox(False, "bubblewrap is not installed (no bwrap on PATH)")
    cgroup_parent = _pids_cgroup_parent()
    if not cgroup_parent and os.geteuid() == 0:
        # the kernel never applies RLIMIT_NPROC to root, and bwrap's --uid maps to root outside
        return _Sandbox(False, "the worker runs as root and no writable pids cgroup was found to bound the "
                               "sandbox's processes (set TRELLIS_SANDBOX_CGROUP or run the worker as another user)")
    reason = ""
    for unshare in UNSHARE_CHOICES:
        argv = _sandbox_argv(bwrap, unshare)
        try:
            probe = subprocess.run(
                [*argv, *SEALED, "--", "/bin/true"], stdin=subprocess.DEVNULL, capture_output=True,
                timeout=PROBE_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            reason = f"bubblewrap could not start a sandbox: {error}"
            continue
        if probe.returncode == 0:
            return _Sandbox(True, "", tuple(argv), cgroup_parent)
        stderr = probe.stderr.decode(errors="replace").strip()
        reason = f"bubblewrap could not start a sandbox: {stderr or f'exit code {probe.returncode}'}"
    return _Sandbox(False, reason)


def _pids_cgroup_parent() -> str:
    """A pids cgroup directory this process may create children in (the operator's
    TRELLIS_SANDBOX_CGROUP, e.g. a delegated cgroup v2 directory, else the cgroup v1 pids
    hierarchy), or "" when there is none."""
    for candidate in (settings.TRELLIS_SANDBOX_CGROUP, CGROUP_V1_PIDS):
        if not candidate:
            continue
        trial = Path(candidate, f"trellis-probe-{uuid.uuid4().hex[:12]}")
        try:
            trial.mkdir()
        except OSError:
            continue
        try:
            if (trial / "pids.max").exists():
                return candidate
        finally:
            trial.rmdir()
    return ""


# What programs need from /etc: the loader, users, time zone, git's config, certificates.
ETC_ALLOWED = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf",
    "localtime", "gitconfig", "bash.bashrc", "inputrc", "ssl/certs", "ca-certificates", "magic", "mime.types",
)
# What programs need from /usr: not /usr/local, /usr/src or /usr/include (site installs, sources).
USR_ALLOWED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec", "share")


def _sandbox_argv(bwrap: str, unshare: tuple[str, ...]) -> list[str]:
    """bwrap options for a minimal system: parts of /usr and /etc read-only, a private sized /tmp
    and /dev/shm, nothing else (the command's own options end with ``SEALED``)."""
    argv = [bwrap, *unshare, "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        argv += ["--setenv", name, value]
    for name in USR_ALLOWED:
        argv += ["--ro-bind-try", f"/usr/{name}", f"/usr/{name}"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/", name)
        if top.is_symlink():  # merged /usr: recreate the link
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    for entry in ETC_ALLOWED:  # not /etc wholesale: no shadow files, no service credentials
        argv += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(shm_bytes()), "--tmpfs", "/dev/shm",
             "--size", str(tmp_bytes()), "--tmpfs", "/tmp"]
    return argv


def _hide_protected() -> list[str]:
    """Empty directories over Trellis's own files wherever a bound system directory holds them
    (a deployment installed under /usr, say), so no command can read them."""
    bound = [Path(os.path.realpath(f"/usr/{name}")) for name in USR_ALLOWED]
    bound += [Path(os.path.realpath(f"/{name}")) for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")]
    argv = []
    for own in protected_paths():
        if any(own.is_relative_to(source) for source in bound if source.is_dir()):
            argv += ["--tmpfs", str(own)]
    return argv


def _tasks_of(uid: int) -> int:
    """How many tasks (threads included, as RLIMIT_NPROC counts them) ``uid`` runs now."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/status") as status:
                total += next((int(line.split()[1]) for line in status if line.startswith("Threads:")), 1)
        except (OSError, ValueError):
            continue
    return total


def _limit_resources(cgroup: str, nproc: int) -> None:
    """In the child before exec: the ceilings for everything in the sandbox, and its pids cgroup."""
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    # SIGXCPU (a named death) at the soft limit; SIGKILL a little later if it is ignored
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS + 5))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (tmp_bytes(), tmp_bytes()))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _new_cgroup(parent: str) -> str:
    path = os.path.join(parent, f"trellis-sandbox-{uuid.uuid4().hex}")
    os.mkdir(path)
    with open(os.path.join(path, "pids.max"), "w") as limit:
        limit.write(str(MAX_PROCESSES))
    memory = os.path.join(path, "memory.max")  # cgroup v2 with the memory controller delegated
    if os.path.exists(memory):
        with open(memory, "w") as limit:
            limit.write(str(memory_bytes()))
    return path


def _hit_pids_max(path: str) -> bool:
    """Whether a fork in the cgroup was refused by ``pids.max`` (its ``max`` event count)."""
    try:
        with open(os.path.join(path, "pids.events")) as events:
            return any(line.split()[:1] == ["max"] and line.split()[1] != "0" for line in events)
    except (OSError, IndexError):
        return False


def _remove_cgroup(path: str) -> None:
    """Kill whatever the command left behind in its cgroup, then remove the cgroup."""
    deadline = time.monotonic() + KILL_GRACE_S * 5
    while True:
        try:
            with open(os.path.join(path, "cgroup.procs")) as procs:
                pids = [int(line) for line in procs if line.strip()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids:
            try:
                os.rmdir(path)
            except OSError:
                pass
            else:
                return
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)


def run_bash(workspace: Workspace, command: str, timeout_ms: int = 30_000) -> BashResult:
    """Run ``command`` with bash inside the sandbox, in the workspace root (mounted read-only).

    Output is stdout and stderr merged, capped to MAX_OUTPUT_CHARS (head and tail kept).
    On timeout the whole sandbox is killed and ``exit_code`` is None; nothing it started
    outlives the call.
    """
    if not MIN_TIMEOUT_MS <= timeout_ms <= MAX_TIMEOUT_MS:
        raise WorkspaceError(
            "invalid_arguments", f"timeout_ms must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS}"
        )
    sandbox = _probe()
    if not sandbox.available:
        raise WorkspaceError("sandbox_unavailable", sandbox.reason)
    root = str(workspace.root)
    argv = [*sandbox.argv, *_hide_protected(), "--ro-bind", root, root, "--chdir", root, *SEALED,
            "--", "/bin/bash", "-c", command]
    cgroup = _new_cgroup(sandbox.cgroup_parent) if sandbox.cgroup_parent else ""
    # Without a cgroup RLIMIT_NPROC counts every task of this user: leave room for what runs already.
    nproc = 0 if cgroup else _tasks_of(os.getuid()) + MAX_PROCESSES
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=functools.partial(_limit_resources, cgroup, nproc),
        )
        output = _DecodedOutput(MAX_OUTPUT_CHARS - 100)  # room for the status line within the tool bound
        finished = _pump(process, output, time.monotonic() + timeout_ms / 1000)
        if not finished:
            # bwrap is the group leader; --die-with-parent takes the sandbox's pid namespace down with it.
            os.killpg(process.pid, signal.SIGKILL)
            _pump(process, output, time.monotonic() + KILL_GRACE_S)
        process.stdout.close()
        exit_code = process.wait()
        limit_hit = bool(cgroup) and _hit_pids_max(cgroup)
    finally:
        if cgroup:
            _remove_cgroup(cgroup)
    return BashResult(
        exit_code=exit_code if finished else None, output=output.text(), timed_out=not finished, timeout_ms=timeout_ms,
        process_limit_hit=limit_hit,
    )


def _pump(process: subprocess.Popen, output: _DecodedOutput, deadline: float) -> bool:
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


class _DecodedOutput(BoundedStream):
    """A command's output bytes, decoded as UTF-8 as they come and bounded head+tail (``collab.text``)."""

    def __init__(self, limit: int):
        super().__init__(limit)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.add(self.decoder.decode(data))

    def finish(self) -> None:
        self.add(self.decoder.decode(b"", final=True))
