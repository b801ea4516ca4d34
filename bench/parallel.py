#!/usr/bin/env python
"""Many turns at once: one worker process runs many turns (``collab/runtime/slots.py``,
``TRELLIS_TURNS_PER_WORKER``), measured on this machine on the embedded default and on
PostgreSQL + Redis, side by side, beside the targets.

    .venv/bin/python bench/parallel.py [--db sqlite|postgres|both] [--quick | --cases fanout-8 sessions-48 …]
        [--model-ms MS] [--workers N] [--turns-per-worker N] [--clients 32] [--quiet-wait 15]

Layouts (``--db``, default both):

- ``sqlite``: the embedded default — a throw-away SQLite file (``TRELLIS_VAR_DIR`` a temporary
  directory), django-q2's ORM broker, the in-memory channel layer and the database relay;
- ``postgres``: a throw-away database ``<db>_bench_parallel`` next to DATABASE_URL's (default
  ``postgres://postgres@127.0.0.1:5432/test``), the Redis broker and layer (REDIS_URL, default
  ``redis://127.0.0.1:6379/14``). Loopback hosts only.

The environment is ``bench/_common.py``'s (``bench_env``) and otherwise the settings' defaults,
as ``scripts/run`` and ``deploy/`` run: the settings' worker processes (``TRELLIS_WORKERS``, 2)
unless ``--workers``, their turn slots (``TRELLIS_TURNS_PER_WORKER``, 128) unless
``--turns-per-worker``, PostgreSQL's connection pool (``DB_POOL_MAX_SIZE``, 8 per process). One
exception: a turn may make ``TRELLIS_MAX_TOOL_CALLS`` (50) tool calls, so when the fan-out of 128
is measured it is 200 for that layout (one turn spawns the 128). The header prints what was set.

Each layout runs one real daphne (``config.asgi``) for all its cases and, for each case, a fresh
``manage.py qcluster``. Before a case the bench waits (at most ``--quiet-wait`` s) for the
machine to be under 15 % busy: other load takes the two cores from the turns. A case runs in a
process of its own (``--phase case``) that warms the new worker up (a coordinator spawning 4
children, unmeasured), waits a second, reads the idle figures, submits the case's turns through
the public API (``POST /api/sessions/{sid}/turns``, bearer token, to the daphne) and waits until
every job of the case is terminal (for a fan-out: and every child's result delivered to the
coordinator). Meanwhile a sampler thread reads, every ~50 ms: the turns in flight (jobs with
status ``running``); PostgreSQL's client connections to the bench database (``pg_stat_activity``,
the bench's own excluded by their ``application_name``) and, at each new peak, which process holds
them (from their sockets' ports); the RSS and threads of the web process and of each qcluster
process (a worker is a child of the qcluster's sentinel, forked first; ``Job.worker`` confirms
it); the CPU of the bench database's backends.

Cases (``--cases``; default all but stream-128; ``--quick``: fanout-8, fanout-32, sessions-48):

- ``fanout-N`` (N = 8, 32, 128): a coordinator (scripted, the scripted provider's format) whose user turn calls
  ``agent(…, agent_id="child", run_in_background=true)`` N times in one step; each child's one
  model call takes the model time (a ``{"sleep_ms": MS}`` step before its text; default 2000 ms).
  The bench project's ``max_spawn_fanout`` is raised to N. Wall: the user turn's admission → the
  last child terminal (the jobs' own timestamps). Target for 8 and 32: 1.25 x model time + 0.5 s.
- ``sessions-N`` (N = 48, 200): N sessions, one turn each, submitted at once by ``--clients``
  clients (threads, each on its own kept-alive connection); each turn's model call takes the
  model time (default 3000 ms). Wall: the first admission → the last turn terminal. Target for
  200: 2 x model time.
- ``stream-N`` (N = 8, 32; 128 only when named): the fan-out, each child on the ``openai``
  provider against a fake OpenAI-compatible Chat Completions server in the measuring process
  (stdlib ``http.server`` on 127.0.0.1, a model connection pointing at it) that streams 50
  tokens/s (SSE): model time / 20 ms tokens. Target as the fan-out's.

Figures per case, beside the targets: turns in flight (peak), wall time and wall ÷ model time
(with where the time went: the children's admission, admitted → claimed, claimed → ended), peak
database connections (target ≤ 24; n/a on SQLite; there instead, how long a writer waits for
SQLite's write lock: the sampler takes it with ``BEGIN IMMEDIATE`` every ~50 ms and gives it back,
target ≤ 1 s), RSS of the web process and of each worker
process (idle → peak, and their threads), memory per turn in flight ((the workers' peak RSS −
their idle RSS) ÷ peak turns in flight; target ≤ 2 MB), platform CPU per turn (web + the
qcluster's processes + the bench database's PostgreSQL backends + redis-server over the case, ÷
the case's jobs), the measuring process's own CPU, the machine's cores over the case and the
other processes' CPU (load that is not the bench's shows there), turns claimed per worker process,
and what went wrong: jobs not succeeded, POSTs refused, lines of the worker's and the web's logs
that are not routine. Statements and commits per turn are ``bench/turns.py``'s (traced):
PostgreSQL 15 flushes an idle backend's counters only every 10 s, so they are not read here.
"""

import argparse
import collections
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402
from bench.live import daphne, free_port  # noqa: E402
from bench.turns import _Http  # noqa: E402

PG_DEFAULT = "postgres://postgres@127.0.0.1:5432/test"
REDIS_DEFAULT = "redis://127.0.0.1:6379/14"
MEASURE_APP = "bench-parallel-measure"  # application_name of the measuring process's connections
TOKENS_PER_S = 50
FANOUT_MODEL_MS = 2000
SESSIONS_MODEL_MS = 3000
WARM_CHILDREN = 4
SAMPLE_S = 0.05
CASES = {  # name: (kind, N)
    "fanout-8": ("fanout", 8), "fanout-32": ("fanout", 32), "fanout-128": ("fanout", 128),
    "sessions-48": ("sessions", 48), "sessions-200": ("sessions", 200),
    "stream-8": ("stream", 8), "stream-32": ("stream", 32), "stream-128": ("stream", 128),
}
DEFAULT_CASES = [c for c in CASES if c != "stream-128"]  # stream-128 only when named
QUICK = ["fanout-8", "fanout-32", "sessions-48"]
LAYOUTS = {"sqlite": "embedded (SQLite + ORM broker)", "postgres": "PostgreSQL + Redis"}
TARGET_CONNECTIONS = 24
TARGET_MB_PER_TURN = 2.0
TARGET_WRITE_WAIT_S = 1.0  # SQLite: no writer stalls longer than this
WRITE_WAIT = "SQLite write lock: a writer's wait (probe every ~50 ms), p50 / p99 / max"
DEFAULT_MAX_TOOL_CALLS = 50  # settings.TRELLIS_MAX_TOOL_CALLS's default


def model_ms(args, kind: str) -> int:
    return args.model_ms or (SESSIONS_MODEL_MS if kind == "sessions" else FANOUT_MODEL_MS)


def wall_target(kind: str, n: int, model_s: float) -> float | None:
    """The wall-time target, in seconds, or None where none is set."""
    if kind in ("fanout", "stream") and n in (8, 32):
        return 1.25 * model_s + 0.5
    if kind == "sessions" and n == 200:
        return 2 * model_s
    return None


# --- /proc: processes, memory, sockets ---------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid → (ppid, pgid, start time in ticks) of every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _common._stat(name)
            if fields is not None:
                table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def cluster_processes(cluster_pid: int, workers: int) -> dict[int, str]:
    """The qcluster's processes by role. django-q2 forks a sentinel from the main process, and
    from the sentinel its ``workers`` worker processes first, then the monitor and the pusher."""
    table = _proc_table()

    def kids(pid):
        return sorted((p for p, row in table.items() if row[0] == pid), key=lambda p: (table[p][2], p))

    roles = {cluster_pid: "qcluster main"}
    for sentinel in kids(cluster_pid):
        roles[sentinel] = "sentinel"
        for i, pid in enumerate(kids(sentinel)):
            roles[pid] = (f"worker {i + 1}" if i < workers else "monitor" if i == workers
                          else "pusher" if i == workers + 1 else "qcluster other")
    return roles


def status_of(pid: int) -> tuple[int, int] | None:
    """(RSS in kB, threads) of a process, None if it is gone."""
    rss = threads = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except OSError:
        return None
    return (rss or 0, threads or 0)


def all_cpu() -> dict[int, tuple[str, float]]:
    """pid → (name, its own CPU seconds so far) of every process now (not its reaped children's:
    a shell's would count a whole test run that ended meanwhile)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _common._stat(name)
            if fields is not None:
                found[int(name)] = (_common._comm(name), (int(fields[11]) + int(fields[12])) / ticks)
    return found


def foreign_cpu(before: dict, after: dict, ours) -> dict[str, float]:
    """CPU seconds used between two ``all_cpu`` readings by the processes not in ``ours``, by name."""
    used = collections.Counter()
    for pid, (name, cpu) in after.items():
        if pid not in ours:
            used[name] += cpu - (before[pid][1] if pid in before and before[pid][0] == name else 0.0)
    return {name: cpu for name, cpu in used.most_common(4) if cpu >= 0.05}


def pss_of(pid: int) -> int:
    """Proportional set size in kB (shared pages divided among their sharers), 0 if unknown."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def sqlite_handles(pid: int, path: str) -> int:
    """Open file handles of ``pid`` on the SQLite database file: one per connection."""
    count = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == path
        except OSError:
            continue
    return count


def socket_owners(pids) -> dict[int, int]:
    """Local TCP port → pid, for the sockets of ``pids`` that talk to port 5432."""
    inode_port = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if int(parts[2].rsplit(":", 1)[1], 16) == 5432:
                        inode_port[parts[9]] = int(parts[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    owners = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                port = inode_port.get(target[8:-1])
                if port is not None:
                    owners[port] = pid
    return owners


# --- the fake model server (OpenAI Chat Completions, streaming) -------------------------------


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # every child connects at once: the default backlog (5) drops SYNs


class _FakeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        try:
            if body.get("stream"):
                fake.stream(self, body)
            else:
                fake.answer(self)
        except (BrokenPipeError, ConnectionResetError):
            fake.count("broken")


class FakeOpenAI:
    """An OpenAI-compatible Chat Completions endpoint on 127.0.0.1: a streamed call (``stream``)
    answers ``tokens`` content chunks at ``TOKENS_PER_S`` (each on its schedule from the start of
    the answer, so the stream lasts tokens / rate whatever the jitter), then the usage chunk and
    ``[DONE]``; a call whose messages say ``warm-up`` answers 3 tokens. A call without ``stream``
    (the branch's title) answers at once. Counts what it served, and the streams open at once."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.open = self.peak_open = 0
        self.httpd = _FakeServer(("127.0.0.1", 0), _FakeHandler)
        self.httpd.fake = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-openai", daemon=True)

    def start(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    @staticmethod
    def _chunk(delta: dict, finish=None) -> bytes:
        data = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "bench",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(data)}\n\n".encode()

    def stream(self, handler, body: dict) -> None:
        warm = "warm-up" in json.dumps(body.get("messages", []))
        tokens = 3 if warm else self.tokens
        with self.lock:
            self.counts["warm-up streams" if warm else "streams"] += 1
            self.open += 1
            self.peak_open = max(self.peak_open, self.open)
        try:
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream")
            handler.send_header("cache-control", "no-cache")
            handler.end_headers()
            handler.close_connection = True
            out = handler.wfile
            out.write(self._chunk({"role": "assistant", "content": ""}))
            out.flush()
            start = time.monotonic()
            for i in range(tokens):
                time.sleep(max(0.0, start + (i + 1) / TOKENS_PER_S - time.monotonic()))
                out.write(self._chunk({"content": f" tok{i}"}))
                out.flush()
            out.write(self._chunk({}, "stop"))
            usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "bench",
                     "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": tokens,
                                              "total_tokens": 50 + tokens}}
            out.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            out.flush()
        finally:
            with self.lock:
                self.open -= 1

    def answer(self, handler) -> None:
        self.count("titles")
        data = json.dumps({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Bench child"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
        }).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


# --- the measuring process (--phase case) ----------------------------------------------------


class Sampler(threading.Thread):
    """Every ``SAMPLE_S`` until stopped (at most ``limit_s``): turns in flight, PostgreSQL client
    connections to the bench database (and which process holds them, at each new peak), RSS and
    threads of the platform's processes, and the CPU of the bench database's backends."""

    def __init__(self, platform: dict[int, str], db_name: str | None, sqlite_path: str | None = None,
                 limit_s: float = 900.0):
        super().__init__(name="bench-sampler", daemon=True)
        self.platform, self.db_name, self.sqlite_path, self.limit_s = platform, db_name, sqlite_path, limit_s
        self.sqlite_peak: dict[str, int] = {}  # role → most handles on the SQLite file seen at once
        self.done = threading.Event()
        self.ready = threading.Event()  # the backends open before the window are read
        self.samples = 0
        self.peak_running = 0
        self.peak_conns = 0
        self.conns_at_peak: dict[str, int] = {}
        self.rss_peak: dict[int, int] = {}
        self.threads_peak: dict[int, int] = {}
        self.workers_rss_peak = 0
        self.gone: set[int] = set()
        self.backend_cpu: dict[int, list[float]] = {}  # backend pid → [CPU at first sight in the window, last]
        self.error = ""
        self.write_waits: list[float] = []  # SQLite: how long the probe waited for the write lock, each sample

    def probe_write_lock(self, probe) -> None:
        """SQLite: take the write lock as any writer does (``BEGIN IMMEDIATE``, the settings' busy
        timeout) and give it back at once; how long that took is a writer's wait at that moment. A
        probe that times out (30 s) is a wait of at least that long, recorded as such; sampling goes
        on. The probe is one more writer among the turns', taking the lock for microseconds."""
        tick = time.monotonic()
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
        except sqlite3.OperationalError:  # "database is locked" past the timeout
            pass
        self.write_waits.append(time.monotonic() - tick)

    def pg_rows(self, conn) -> list[tuple[int, int]]:
        return conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend' "
            "AND application_name <> %s", (self.db_name, MEASURE_APP)).fetchall()

    def start_window(self, conn) -> int:
        """The backends open now, with their CPU so far (only what they use from now counts)."""
        rows = self.pg_rows(conn)
        for pid, _ in rows:
            cpu = _common.cpu_seconds(pid)
            self.backend_cpu[pid] = [cpu, cpu]
        return len(rows)

    def backends_cpu(self) -> float:
        return sum(last - first for first, last in self.backend_cpu.values())

    def run(self):
        from django.db import connection

        from collab.models import Job, JobStatus

        pg = probe = None
        try:
            if self.sqlite_path:
                probe = sqlite3.connect(self.sqlite_path, timeout=30, isolation_level=None)
            if self.db_name:
                import psycopg
                from django.conf import settings

                db = settings.DATABASES["default"]
                pg = psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                                     password=db["PASSWORD"] or None, dbname=db["NAME"], autocommit=True,
                                     application_name=MEASURE_APP)
                self.start_window(pg)
            self.ready.set()
            workers = [pid for pid, role in self.platform.items() if role.startswith("worker")]
            started = time.monotonic()
            while not self.done.is_set() and time.monotonic() - started < self.limit_s:
                tick = time.monotonic()
                self.samples += 1
                running = Job.objects.filter(status=JobStatus.RUNNING).count()
                self.peak_running = max(self.peak_running, running)
                if probe is not None:
                    self.probe_write_lock(probe)
                if pg is not None:
                    rows = self.pg_rows(pg)
                    if len(rows) > self.peak_conns:  # a new peak: which process holds them (sockets' ports)
                        self.peak_conns = len(rows)
                        owners = socket_owners(self.platform)
                        held = collections.Counter(self.platform.get(owners.get(port), "?") for _, port in rows)
                        self.conns_at_peak = dict(held)
                    if self.samples % 4 == 1:
                        for pid, _ in rows:
                            cpu = _common.cpu_seconds(pid)
                            self.backend_cpu.setdefault(pid, [0.0, 0.0])[1] = cpu  # new in the window: all of it
                total = 0
                for pid in self.platform:
                    seen = status_of(pid)
                    if seen is None:
                        self.gone.add(pid)
                        continue
                    self.rss_peak[pid] = max(self.rss_peak.get(pid, 0), seen[0])
                    self.threads_peak[pid] = max(self.threads_peak.get(pid, 0), seen[1])
                    if pid in workers:
                        total += seen[0]
                    if self.sqlite_path and self.samples % 4 == 1:
                        handles = sqlite_handles(pid, self.sqlite_path)
                        role = self.platform[pid]
                        self.sqlite_peak[role] = max(self.sqlite_peak.get(role, 0), handles)
                self.workers_rss_peak = max(self.workers_rss_peak, total)
                self.done.wait(max(0.0, SAMPLE_S - (time.monotonic() - tick)))
            if pg is not None:  # the last reading of every backend still open
                for pid, _ in self.pg_rows(pg):
                    if pid in self.backend_cpu:
                        self.backend_cpu[pid][1] = _common.cpu_seconds(pid)
        except Exception as exc:  # reported, not raised: the case's other figures still stand
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            if pg is not None:
                pg.close()
            if probe is not None:
                probe.close()
            connection.close()

    def stop(self):
        self.done.set()
        self.join(30)


def _bench_project(n: int):
    """The bench user, project (limits raised so N children are admitted) and a token."""
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken, Membership, Project, TokenScope

    user, _ = get_user_model().objects.get_or_create(username="bench")
    project, _ = Project.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    Membership.objects.get_or_create(user=user, project=project, defaults={"role": "owner"})
    # one turn spawns N children (fan-out) and N sessions' turns run at once; the other resource
    # limits are null (none) by default, max_running_jobs's ceiling is every slot of the cluster
    project.max_spawn_fanout = max(n, project.max_spawn_fanout)
    project.save(update_fields=["max_spawn_fanout"])
    _, token = ApiToken.issue(user, name="bench-parallel", scopes=TokenScope.values)
    return user, project, token


def _coordinator(children: int, child_agent: str, prompt: str) -> dict:
    calls = [{"name": "agent", "arguments": {"prompt": f"{prompt} {i}", "description": f"child {i}",
                                             "agent_id": child_agent, "run_in_background": True}}
             for i in range(children)]
    return {"user": [{"tool_calls": calls}, {"text": "spawned"}], "followup": [{"text": "noted"}]}


def _specs(project, kind: str, n: int, ms: int, fake_url: str | None) -> None:
    from collab.models import AgentSpec, ModelConnection

    child = "streamer" if kind == "stream" else "child"
    AgentSpec.objects.update_or_create(project=project, agent_id="quick", defaults={"script": [{"text": "quick"}]})
    AgentSpec.objects.update_or_create(project=project, agent_id="child",
                                       defaults={"script": [{"sleep_ms": ms, "text": "child done"}]})
    AgentSpec.objects.update_or_create(project=project, agent_id="solo",
                                       defaults={"script": [{"sleep_ms": ms, "text": "turn done"}]})
    AgentSpec.objects.update_or_create(project=project, agent_id="warm", defaults={
        "script": _coordinator(WARM_CHILDREN, "streamer" if kind == "stream" else "quick", "warm-up")})
    AgentSpec.objects.update_or_create(project=project, agent_id=f"fan-{n}", defaults={
        "script": _coordinator(n, child, "child task")})
    if fake_url:
        conn, _ = ModelConnection.objects.update_or_create(
            name="bench-fake", defaults={"provider": "openai", "base_url": fake_url, "key_env": "", "all_projects": True,
                                         "enabled": True})
        AgentSpec.objects.update_or_create(project=project, agent_id="streamer", defaults={
            "provider": "openai", "model": "bench-model", "connection": conn, "script": [], "limits": {"stream": True}})


def _settle(session_ids: list, children_of: str | None, n: int, deadline: float) -> bool:
    """Wait (until ``deadline``) for every job of these sessions to be terminal and, for a
    fan-out, every child's result delivered to the coordinator's session."""
    from collab.models import TERMINAL_STATUSES, Job
    from collab.models.jobs import FollowupState

    jobs = Job.objects.filter(session_id__in=session_ids)
    while time.monotonic() < deadline:
        if not jobs.exclude(status__in=TERMINAL_STATUSES).exists():
            if children_of is None:
                return True
            if not jobs.filter(followup_state=FollowupState.OWED).exists() and jobs.filter(
                    caller_session_id=children_of, followup_state=FollowupState.DELIVERED).count() >= n:
                return True
        time.sleep(0.1)
    return False


def _post(http: _Http, sid: str, prompt: str) -> tuple[int, bytes]:
    try:
        return http.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    except OSError as exc:
        return 0, str(exc).encode()


def _submit(url: str, token: str, sessions: list, prompt: str, clients: int) -> dict:
    """One turn on each session, posted at once by ``clients`` clients (threads, each on a
    kept-alive connection opened before the start): the first send, the last 202, failures."""
    k = max(1, min(clients, len(sessions)))
    shares = [sessions[i::k] for i in range(k)]
    barrier = threading.Barrier(k, timeout=60)
    marks = {"first": [], "last": [], "failed": [], "ids": []}
    lock = threading.Lock()

    def run(share):
        http = _Http(url, token)
        http.conn.connect()
        barrier.wait()
        first = time.time()
        for sid in share:
            status, content = _post(http, sid, prompt)
            with lock:
                if status == 202:
                    marks["ids"].append(json.loads(content)["execution_id"])
                else:
                    marks["failed"].append(f"{status} {content[:200]!r}")
        with lock:
            marks["first"].append(first)
            marks["last"].append(time.time())
        http.conn.close()

    with ThreadPoolExecutor(k) as pool:
        list(pool.map(run, shares))
    return {"first": min(marks["first"]), "last": max(marks["last"]), "failed": marks["failed"], "ids": marks["ids"]}


def phase_case(args):
    from django.conf import settings
    from django.db.models import Count

    from collab.models import Job, JobKind
    from collab.services.sessions import do_create_session

    kind, n = CASES[args.case]
    ms = model_ms(args, kind)
    tokens = max(1, round(ms * TOKENS_PER_S / 1000))
    user, project, token = _bench_project(n)
    fake = FakeOpenAI(tokens).start() if kind == "stream" else None
    try:
        _specs(project, kind, n, ms, fake.url if fake else None)
        workers = settings.Q_CLUSTER["workers"]
        pg_name = settings.DATABASES["default"]["NAME"] if "postgresql" in settings.DATABASES["default"]["ENGINE"] else None
        out = {"workers": workers, "slots": settings.TRELLIS_TURNS_PER_WORKER,
               "pool": (settings.DATABASES["default"].get("OPTIONS", {}).get("pool") or {}).get("max_size"),
               "max_running": settings.TRELLIS_LIMIT_CEILINGS["max_running_jobs"], "notes": []}

        # warm-up (unmeasured): a coordinator and its children on this fresh worker
        warm = do_create_session(user, project, title="warm-up", agent_id="warm")
        status, content = _post(_Http(args.url, token), warm.pk, "warm-up")
        if status != 202:
            raise SystemExit(f"warm-up POST: {status} {content[:500]!r}")
        if not _settle([warm.pk], warm.pk, WARM_CHILDREN, time.monotonic() + 60):
            out["notes"].append("the warm-up did not settle within 60 s")

        if kind == "sessions":
            sessions = [do_create_session(user, project, title=f"s{i}", agent_id="solo").pk for i in range(n)]
        else:
            sessions = [do_create_session(user, project, title=f"fan-out {n}", agent_id=f"fan-{n}").pk]
        time.sleep(1.0)  # idle: the warm-up's last writes and follow-ups are over

        platform = {args.web_pid: "web", **cluster_processes(args.cluster_pid, workers)}
        idle = {pid: status_of(pid) for pid in platform}
        idle_pss = {pid: pss_of(pid) for pid in platform}
        db = settings.DATABASES["default"]
        sqlite_path = None if pg_name else os.path.realpath(str(db["NAME"]))
        sampler = Sampler(platform, pg_name, sqlite_path)
        roles = {"web": ("pid", args.web_pid), "qcluster": ("pgid", args.cluster_pid)}
        if pg_name:  # redis-server's CPU, and the idle connections before the window
            import psycopg

            roles["redis-server"] = ("comm", "redis-server")
            with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"],
                                 autocommit=True, application_name=MEASURE_APP) as conn:
                out["idle_conns"] = len(sampler.pg_rows(conn))
        cpu_before, machine_before = _common.cpu_by_role(roles), _common.machine_times()
        everyone_before = all_cpu()
        self_before = _common.cpu_seconds(os.getpid())
        sampler.start()
        sampler.ready.wait(10)

        if kind == "sessions":
            sent = _submit(args.url, token, sessions, "one turn, please", args.clients)
        else:
            sent = _submit(args.url, token, sessions, "fan out", 1)
        deadline = time.monotonic() + 120 + 4 * ms / 1000 * max(1, n / 32)
        settled = _settle(sessions, None if kind == "sessions" else sessions[0], n, deadline)
        sampler.stop()
        cpu_after, machine_after = _common.cpu_by_role(roles), _common.machine_times()
        # what else ran meanwhile (this process and the platform's processes aside): the other
        # PostgreSQL processes (the bench's own connections, the server's background work) and
        # any load on the machine that is not the bench's
        ours = {os.getpid(), *platform, *sampler.backend_cpu}
        out["foreign_cpu"] = foreign_cpu(everyone_before, all_cpu(), ours)
        out["self_cpu"] = _common.cpu_seconds(os.getpid()) - self_before
        out["cpu"] = _common.cpu_used(cpu_before, cpu_after)
        # the qcluster's CPU split: its worker processes, and the rest (main, sentinel, monitor, pusher)
        qcluster = out["cpu"].pop("qcluster")
        in_workers = sum(cpu - cpu_before["qcluster"].get(pid, 0.0) for pid, cpu in cpu_after["qcluster"].items()
                         if platform.get(pid, "").startswith("worker"))
        out["cpu"]["workers"] = in_workers
        out["cpu"]["qcluster other"] = qcluster - in_workers
        if pg_name:
            out["cpu"]["postgres backends"] = sampler.backends_cpu()
        out["machine"] = {k: machine_after[k] - machine_before[k] for k in machine_after}
        if sampler.error:
            out["notes"].append(f"sampler: {sampler.error}")
        if not settled:
            out["notes"].append("the case did not settle before its deadline")
        out["failed_posts"] = sent["failed"][:3]
        out["failed_post_count"] = len(sent["failed"])

        jobs = Job.objects.filter(session_id__in=sessions)
        rows = list(jobs.values("kind", "status", "created_at", "started_at", "finished_at", "worker", "error_code",
                                "error_reason"))
        out["turns"] = len(rows)
        out["kinds"] = dict(collections.Counter(r["kind"] for r in rows))
        out["statuses"] = dict(collections.Counter(r["status"] for r in rows))
        out["errors"] = [f"{code}: {reason[:200]}" for code, reason in
                         collections.Counter((r["error_code"], r["error_reason"]) for r in rows
                                             if r["status"] != "succeeded")][:5]
        measured = [r for r in rows if r["kind"] == (JobKind.USER if kind == "sessions" else JobKind.SPAWN)]
        done = [r for r in measured if r["finished_at"]]
        if kind == "sessions":
            start = min((r["created_at"] for r in measured), default=None)
        else:
            start = next((r["created_at"] for r in rows if r["kind"] == JobKind.USER), None)
        out["measured"] = len(measured)
        out["measured_done"] = len(done)
        if start and done:
            out["wall"] = (max(r["finished_at"] for r in done) - start).total_seconds()
            out["settle"] = (max(r["finished_at"] for r in rows if r["finished_at"]) - start).total_seconds()
            out["from_first_post"] = max(r["finished_at"] for r in done).timestamp() - sent["first"]
            waits = sorted((r["started_at"] - r["created_at"]).total_seconds() for r in done if r["started_at"])
            runs = sorted((r["finished_at"] - r["started_at"]).total_seconds() for r in done if r["started_at"])
            out["claim_wait"] = [_common.percentile(waits, 0.5), waits[-1]] if waits else None
            out["run_time"] = [_common.percentile(runs, 0.5), runs[-1]] if runs else None
            out["admission_span"] = (max(r["created_at"] for r in measured) - start).total_seconds()
        out["submit_span"] = sent["last"] - sent["first"]
        out["model_s"] = (tokens / TOKENS_PER_S) if kind == "stream" else ms / 1000

        # by process: turns claimed per worker (Job.worker is host:pid), memory and threads
        by_pid = collections.Counter(int(r["worker"].rsplit(":", 1)[1]) for r in rows if r["worker"])
        out["turns_by_process"] = {platform.get(pid, f"pid {pid}"): count for pid, count in sorted(by_pid.items())}
        out["peak_running"] = sampler.peak_running
        out["peak_conns"] = sampler.peak_conns if pg_name else None
        out["conns_at_peak"] = sampler.conns_at_peak
        out["sqlite_handles"] = {role: n for role, n in sampler.sqlite_peak.items() if n}
        waits = sorted(sampler.write_waits)
        out["write_wait"] = [_common.percentile(waits, 0.5), _common.percentile(waits, 0.99), waits[-1]] if waits else None
        out["samples"] = sampler.samples
        out["procs"] = [{"role": role, "pid": pid, "idle_kb": (idle.get(pid) or (0, 0))[0], "idle_pss_kb": idle_pss[pid],
                         "idle_threads": (idle.get(pid) or (0, 0))[1], "peak_kb": sampler.rss_peak.get(pid, 0),
                         "peak_threads": sampler.threads_peak.get(pid, 0), "gone": pid in sampler.gone}
                        for pid, role in platform.items()]
        out["workers_idle_kb"] = sum((idle.get(pid) or (0, 0))[0] for pid, role in platform.items()
                                     if role.startswith("worker"))
        out["workers_peak_kb"] = sampler.workers_rss_peak
        if fake:
            out["fake"] = {**fake.counts, "peak open streams": fake.peak_open}
        left = Job.objects.exclude(status__in=("succeeded", "failed", "cancelled", "interrupted")).values(
            "status").annotate(n=Count("pk"))
        out["open_jobs_anywhere"] = {r["status"]: r["n"] for r in left}
        print("result=" + json.dumps(out, default=str))
    finally:
        if fake:
            fake.stop()


# --- the orchestrating process -------------------------------------------------------------------


def qcluster(env: dict, timeout: float = 60.0):
    """``_common.worker`` that keeps its log: yields (process, log path)."""
    return _common.worker_logged(env, timeout, prefix="bench-parallel-qcluster-")


ROUTINE = re.compile(r"processing|Processed|running\.|guarding|starting|stopping|has stopped|stopped\.|"
                     r"Process-[0-9a-f]+ (ready|stopped)|recycled worker|Q Cluster|enqueued|queued|"
                     r"monitoring at|pushing tasks at|waiting for the monitor|"
                     r'"(GET|POST) [^"]*" [23]\d\d ', re.I)


def problems(text: str) -> list[str]:
    """Lines of a log that are not routine (errors, warnings, tracebacks), deduplicated with counts."""
    seen = collections.Counter()
    for line in text.splitlines():
        line = line.strip()
        if not line or ROUTINE.search(line) and not re.search(r"error|exception|traceback|critical|warn", line, re.I):
            continue
        seen[re.sub(r"\b[0-9a-f]{8,}\b|\d+", "#", line)[:220]] += 1
    return [f"{count} x {line}" for line, count in seen.most_common(12)]


def layout_env(layout: str, args, cases: list) -> tuple[dict, callable]:
    if layout == "sqlite":
        var = tempfile.mkdtemp(prefix="trellis-bench-parallel-")
        env = _common.bench_env(f"sqlite:///{var}/bench.sqlite3", "orm", tag="bench-parallel")
        env["TRELLIS_VAR_DIR"] = var
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=_common.ROOT, env=env, check=True)
        cleanup = lambda: shutil.rmtree(var, ignore_errors=True)  # noqa: E731
    else:
        url = _common.create_database("bench_parallel")
        env = _common.bench_env(url, "redis", tag="bench-parallel")
        cleanup = lambda: _common.drop_database(url)  # noqa: E731
    if args.workers:
        env["TRELLIS_WORKERS"] = str(args.workers)
    else:
        env.pop("TRELLIS_WORKERS", None)  # the settings' default
    if args.turns_per_worker:
        env["TRELLIS_TURNS_PER_WORKER"] = str(args.turns_per_worker)
    most = max((CASES[c][1] for c in cases if CASES[c][0] != "sessions"), default=0)
    if most + 1 > DEFAULT_MAX_TOOL_CALLS and "TRELLIS_MAX_TOOL_CALLS" not in os.environ:
        env["TRELLIS_MAX_TOOL_CALLS"] = str(max(200, most + 10))
    return env, cleanup


def wait_quiet(limit_s: float) -> float:
    """Wait (at most ``limit_s``) for the machine to be quiet — under 15 % busy over a second —
    so that other load does not take the cores from the case; the last second's busy share."""
    deadline = time.monotonic() + limit_s
    while True:
        before = _common.machine_times()
        time.sleep(1.0)
        after = _common.machine_times()
        spent = {k: after[k] - before[k] for k in after}
        busy = spent["busy"] / (sum(spent.values()) or 1)
        if busy < 0.15 or time.monotonic() > deadline:
            return busy


def run_layout(layout: str, args, cases: list) -> dict:
    print(f"[{layout}] preparing the database …", file=sys.stderr, flush=True)
    env, cleanup = layout_env(layout, args, cases)
    results = {"_env": {k: env[k] for k in sorted(env) if k.startswith(("TRELLIS_", "DB_"))}}
    measure_env = dict(env, PGAPPNAME=MEASURE_APP)
    try:
        port = free_port()
        with tempfile.NamedTemporaryFile("w+", prefix="bench-parallel-daphne-", suffix=".log") as weblog:
            web = daphne(env, port, weblog)
            try:
                for case in cases:
                    print(f"[{layout}] {case} …", file=sys.stderr, flush=True)
                    busy = wait_quiet(args.quiet_wait)
                    started = time.monotonic()
                    try:
                        with qcluster(env) as (cluster, log):
                            try:
                                r = _common.child("parallel.py", "case", measure_env, "--case", case,
                                                  "--url", f"http://127.0.0.1:{port}", "--web-pid", str(web.pid),
                                                  "--cluster-pid", str(cluster.pid), "--clients", str(args.clients),
                                                  *(["--model-ms", str(args.model_ms)] if args.model_ms else []),
                                                  timeout=900)
                                result = json.loads(r["result"])
                            except (SystemExit, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
                                result = {"error": str(exc)[-3000:]}
                        result["worker_log"] = problems(Path(log).read_text(errors="replace"))
                        if args.keep_logs:
                            print(f"[{layout}] {case}: worker log kept at {log}", file=sys.stderr)
                        else:
                            os.unlink(log)
                    except SystemExit as exc:  # the worker did not start
                        result = {"error": str(exc)[-3000:]}
                    result["case_seconds"] = time.monotonic() - started
                    result["busy_before"] = busy
                    results[case] = result
                    print(f"[{layout}] {case}: {summary(result)}", file=sys.stderr, flush=True)
            finally:
                _common.stop(web, 15)
                weblog.seek(0)
                results["_web_log"] = problems(weblog.read())
    finally:
        cleanup()
    return results


def summary(r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"].strip().splitlines()[-1][:200]
    return (f"wall {r.get('wall', float('nan')):.2f} s, peak in flight {r['peak_running']}, "
            f"peak conns {r['peak_conns']}, {r['statuses']}, {r['case_seconds']:.0f} s")


# --- the report ----------------------------------------------------------------------------------


def mb(kb: float) -> str:
    return f"{kb / 1024:.1f} MB"


def case_rows(case: str, r: dict, args) -> list[tuple[str, str]]:
    """(figure, value) rows of one case in one layout."""
    if "error" in r:
        return [("error", r["error"].strip().splitlines()[-1][:160])]
    kind, n = CASES[case]
    rows = []
    model_s = r["model_s"]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items()))
    rows.append(("turns (jobs) in the case", f"{r['turns']} ({kinds})"))
    not_ok = {k: v for k, v in r["statuses"].items() if k != "succeeded"}
    rows.append(("turns not succeeded", ", ".join(f"{k} {v}" for k, v in not_ok.items()) or "0"))
    rows.append(("turns in flight, peak (status running)", str(r["peak_running"])))
    what = "user turns" if kind == "sessions" else "children"
    if "wall" in r:
        rows.append((f"wall: {'first admission' if kind == 'sessions' else 'user turn admitted'} → last of the "
                     f"{r['measured']} {what} terminal", f"{r['wall']:.2f} s"))
        rows.append(("wall ÷ model time", f"{r['wall'] / model_s:.2f}"))
        if kind == "sessions":
            rows.append(("submissions: first POST → last 202", f"{r['submit_span']:.2f} s"))
            rows.append(("first POST → last turn terminal", f"{r['from_first_post']:.2f} s"))
        else:
            rows.append(("admission of the children (1st → last)", f"{r['admission_span']:.2f} s"))
            rows.append(("settled (every result delivered, follow-ups ended)", f"{r['settle']:.2f} s"))
        if r.get("claim_wait"):
            rows.append((f"{what}: admitted → claimed, p50 / max", f"{r['claim_wait'][0] * 1000:.0f} / "
                         f"{r['claim_wait'][1] * 1000:.0f} ms"))
        if r.get("run_time"):
            rows.append((f"{what}: claimed → ended, p50 / max", f"{r['run_time'][0]:.2f} / {r['run_time'][1]:.2f} s"))
    else:
        rows.append(("wall", f"n/a ({r['measured_done']} of {r['measured']} {what} ended)"))
    if r["peak_conns"] is None:
        rows.append(("database connections, idle → peak", "n/a (SQLite)"))
        if r.get("sqlite_handles"):
            rows.append(("SQLite connections (handles on the file), most at once by process",
                         ", ".join(f"{k} {v}" for k, v in r["sqlite_handles"].items())))
        if r.get("write_wait"):
            rows.append((WRITE_WAIT, " / ".join(f"{s * 1000:.0f}" for s in r["write_wait"]) + " ms"))
    else:
        held = ", ".join(f"{k} {v}" for k, v in sorted(r["conns_at_peak"].items()))
        rows.append(("database connections, idle → peak", f"{r.get('idle_conns', '?')} → {r['peak_conns']}"
                     + (f" ({held})" if held else "")))
    for p in r["procs"]:
        if p["role"] == "web" or p["role"].startswith("worker"):
            rows.append((f"RSS {p['role']}, idle → peak (threads)",
                         f"{mb(p['idle_kb'])} → {mb(p['peak_kb'])} ({p['idle_threads']} → {p['peak_threads']})"
                         + (" [process ended during the case]" if p["gone"] else "")))
    others = [p for p in r["procs"] if p["role"] != "web" and not p["role"].startswith("worker")]
    rows.append(("RSS qcluster main + sentinel + monitor + pusher, peak (PSS idle)",
                 f"{mb(sum(p['peak_kb'] for p in others))} ({mb(sum(p['idle_pss_kb'] for p in others))})"))
    if r["peak_running"]:
        per = (r["workers_peak_kb"] - r["workers_idle_kb"]) / r["peak_running"]
        rows.append(("memory per turn in flight ((workers' peak − idle RSS) ÷ peak)", f"{per / 1024:.2f} MB"))
    cpu = r["cpu"]
    platform = sum(cpu.values())
    parts = ", ".join(f"{k} {v / r['turns'] * 1000:.1f}" for k, v in cpu.items())
    rows.append(("platform CPU per turn (÷ the case's jobs), ms", f"{platform / r['turns'] * 1000:.1f} ({parts})"))
    rows.append(("platform CPU over the case", f"{platform:.2f} s"))
    machine = r["machine"]
    whole = sum(machine.values()) or 1
    rows.append(("the bench's own process CPU (clients, sampler, fake model)", f"{r['self_cpu']:.2f} s"))
    if r.get("busy_before") is not None:
        rows.append(("machine busy just before the case (the bench idle: others' load)", f"{r['busy_before']:.0%}"))
    rows.append(("machine cores over the case: busy / idle / steal; busy not ours",
                 f"{machine['busy'] / whole:.0%} / {machine['idle'] / whole:.0%} / {machine['steal'] / whole:.0%}; "
                 f"{max(0.0, machine['busy'] - platform - r['self_cpu']):.2f} s"))
    if r.get("foreign_cpu"):
        rows.append(("other processes' own CPU over the case (by name)",
                     ", ".join(f"{k} {v:.2f} s" for k, v in r["foreign_cpu"].items())))
    rows.append(("turns claimed by process", ", ".join(f"{k} {v}" for k, v in r["turns_by_process"].items())))
    if r.get("fake"):
        rows.append(("fake model server", ", ".join(f"{k} {v}" for k, v in r["fake"].items())))
    if r["failed_post_count"]:
        rows.append(("POSTs not answered 202", f"{r['failed_post_count']}: {r['failed_posts'][:1]}"))
    for note in r["notes"]:
        rows.append(("note", note))
    for error in r["errors"]:
        rows.append(("error of a turn", error))
    if r["open_jobs_anywhere"]:
        rows.append(("jobs still open in the database after the case", str(r["open_jobs_anywhere"])))
    for line in r.get("worker_log", [])[:6]:
        rows.append(("worker log", line[:160]))
    rows.append(("samples (every ~50 ms) / case took", f"{r['samples']} / {r['case_seconds']:.0f} s"))
    return rows


def targets(case: str, r_any: dict | None, args) -> dict[str, str]:
    kind, n = CASES[case]
    model_s = (r_any or {}).get("model_s") or model_ms(args, kind) / 1000
    out = {"database connections, idle → peak": f"<= {TARGET_CONNECTIONS}",
           WRITE_WAIT: f"max <= {TARGET_WRITE_WAIT_S * 1000:.0f} ms",
           "memory per turn in flight ((workers' peak − idle RSS) ÷ peak)": f"<= {TARGET_MB_PER_TURN:.0f} MB",
           "turns not succeeded": "0"}
    target = wall_target(kind, n, model_s)
    if target:
        what = "user turns" if kind == "sessions" else "children"
        start = "first admission" if kind == "sessions" else "user turn admitted"
        measured = n
        out[f"wall: {start} → last of the {measured} {what} terminal"] = f"<= {target:.2f} s"
        out["wall ÷ model time"] = f"<= {target / model_s:.2f}"
    return out


def print_report(results: dict, layouts: list, cases: list, args) -> None:
    head = ["figure", *(LAYOUTS[lay] for lay in layouts), "target"]
    for case in cases:
        kind, n = CASES[case]
        ms = model_ms(args, kind)
        title = {"fanout": f"fan-out: a coordinator spawns {n} background children, each a {ms} ms model call",
                 "sessions": f"{n} sessions, one turn each submitted at once, each a {ms} ms model call",
                 "stream": f"fan-out of {n} children on a streaming OpenAI-compatible server, "
                           f"{round(ms * TOKENS_PER_S / 1000)} tokens at {TOKENS_PER_S}/s"}[kind]
        print(f"\n== {case}: {title}")
        per_layout = {lay: case_rows(case, results[lay].get(case, {"error": "not run"}), args) for lay in layouts}
        names = []
        for lay in layouts:
            for name, _ in per_layout[lay]:
                if name not in names:
                    names.append(name)
        tg = targets(case, next((results[lay][case] for lay in layouts if "model_s" in results[lay].get(case, {})), None),
                     args)
        table = [head]
        for name in names:
            values = []
            for lay in layouts:
                found = [v for k, v in per_layout[lay] if k == name]
                values.append("; ".join(found) if found else "")
            table.append([name, *values, tg.get(name, "")])
        widths = [min(70, max(len(row[i]) for row in table)) for i in range(len(head))]
        for i, row in enumerate(table):
            print(" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                print("-+-".join("-" * w for w in widths))
    for lay in layouts:
        if results[lay].get("_web_log"):
            print(f"\n[{LAYOUTS[lay]}] web log, not routine:")
            for line in results[lay]["_web_log"]:
                print("  " + line[:300])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), help="a subset of the cases (default: all)")
    parser.add_argument("--quick", action="store_true", help="only " + ", ".join(QUICK))
    parser.add_argument("--model-ms", type=int, help=f"a model call's time (default {FANOUT_MODEL_MS} ms for a "
                        f"fan-out's children, {SESSIONS_MODEL_MS} ms for the sessions' turns)")
    parser.add_argument("--workers", type=int, help="worker processes (default: the settings', TRELLIS_WORKERS)")
    parser.add_argument("--turns-per-worker", type=int,
                        help="turns a worker process runs at once (default: the settings', TRELLIS_TURNS_PER_WORKER)")
    parser.add_argument("--clients", type=int, default=32,
                        help="clients submitting the sessions' turns at once (each its own connection)")
    parser.add_argument("--quiet-wait", type=float, default=15.0,
                        help="before each case, wait up to this many seconds for the machine to be under 15%% busy")
    parser.add_argument("--keep-logs", action="store_true", help="keep each case's qcluster log (its path is printed)")
    parser.add_argument("--phase", choices=["case"], help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--web-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cluster-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if _common.run_phase(args, {"case": phase_case}):
        return
    cases = args.cases or (QUICK if args.quick else DEFAULT_CASES)
    layouts = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if "postgres" in layouts:
        os.environ.setdefault("DATABASE_URL", PG_DEFAULT)
        os.environ.setdefault("REDIS_URL", REDIS_DEFAULT)
        for var in ("DATABASE_URL", "REDIS_URL"):
            host = urllib.parse.urlsplit(os.environ[var]).hostname
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise SystemExit(f"{var} must name a loopback host, not {host!r}")
    started = time.monotonic()
    speed = _common.python_speed()
    results = {layout: run_layout(layout, args, cases) for layout in layouts}
    print(f"bench/parallel.py — {os.cpu_count()} cores, Python 10M additions in {speed:.2f} s CPU, "
          f"{time.monotonic() - started:.0f} s in all")
    for layout in layouts:
        r = next((v for k, v in results[layout].items() if not k.startswith("_") and "workers" in v), {})
        env = results[layout]["_env"]
        print(f"[{LAYOUTS[layout]}] {r.get('workers', '?')} worker processes x {r.get('slots', '?')} turn slots, "
              f"connection pool {r.get('pool') or 'none'} per process, max_running_jobs ceiling "
              f"{r.get('max_running', '?')}; environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    print_report(results, layouts, cases, args)


if __name__ == "__main__":
    main()
