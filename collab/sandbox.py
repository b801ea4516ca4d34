"""Shell commands of explorer agents under bubblewrap (docs/contract.md#the-openwork-toolset).

``run_bash`` runs a command with the workspace (``collab.workspace``) mounted read-only, a
private ``/tmp``, no network, an empty environment, no capabilities, the parts of ``/usr``
programs need and none of Trellis's own files, and with limits on processes, CPU seconds,
address space, file size, open files and writable space; it never runs a command
unsandboxed. A command's output passes the text boundary (``collab.text``).
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
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from collab.text import BoundedStream, clean_text
from collab.workspace import MAX_OUTPUT_CHARS, Workspace, WorkspaceError, protected_paths

MIN_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 600_000
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
# Preferred first; the fallback is for hosts where bwrap cannot create a user namespace.
UNSHARE_CHOICES = (("--unshare-all",), ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"))
PROBE_TIMEOUT_S = 10
KILL_GRACE_S = 2


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
