"""Shared helpers for the bench scripts: a throw-away PostgreSQL database next to DATABASE_URL's,
a real ``qcluster`` worker started and stopped around a measurement, and small statistics.

The raw commit rate and percentiles come from ``bench/admission.py`` (imported, not copied)."""

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import percentile, pg_url, raw_insert_rate  # noqa: E402,F401


def require_postgres() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL server (postgres://…); a bench database is created next to it")
    return url


def _admin(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def create_database(suffix: str) -> str:
    """Create (after dropping any leftover) ``<db>_<suffix>`` next to DATABASE_URL's, migrate it,
    and return its URL."""
    import psycopg

    url = require_postgres()
    name = url.rpartition("/")[2] + "_" + suffix
    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    bench_url = pg_url(url, name)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True,
                   env=dict(os.environ, DATABASE_URL=bench_url, DJANGO_SECRET_KEY="bench"))
    return bench_url


def drop_database(bench_url: str) -> None:
    import psycopg

    name = bench_url.rpartition("/")[2]
    with psycopg.connect(_admin(require_postgres()), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_env(bench_url: str, broker: str, workers: int = 2, tag: str = "bench") -> dict:
    """The environment of a worker and of the measuring process: the bench database, the broker
    (``orm``, or ``redis`` with REDIS_URL), a queue name of this run only."""
    env = dict(os.environ, DATABASE_URL=bench_url, DJANGO_SECRET_KEY="bench", TRELLIS_WORKERS=str(workers),
               TRELLIS_QUEUE_NAME=f"{tag}-{broker}-{os.getpid()}", TRELLIS_LOG_LEVEL="WARNING",
               TRELLIS_CHANNEL_PREFIX=f"{tag}-{os.getpid()}")
    if broker != "redis":
        env.pop("REDIS_URL", None)
    return env


def stop(proc, wait: float = 20) -> None:
    """Terminate a process started here and reap it (killed if it does not end in ``wait`` s)."""
    proc.terminate()
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextlib.contextmanager
def worker(env: dict, timeout: float = 60.0):
    """A real ``manage.py qcluster`` for the block: started, awaited until it is running (its
    start-up is not measured), then terminated and reaped."""
    with worker_logged(env, timeout) as (proc, log):
        try:
            yield proc
        finally:
            os.unlink(log)


@contextlib.contextmanager
def worker_logged(env: dict, timeout: float = 60.0, prefix: str = "bench-qcluster-"):
    """``worker``, yielding (process, the path of its log); the caller removes the log."""
    log = tempfile.NamedTemporaryFile("w+", prefix=prefix, suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "manage.py", "qcluster"], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while "running." not in Path(log.name).read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("worker did not start:\n" + Path(log.name).read_text()[-3000:])
            time.sleep(0.2)
        yield proc, log.name
    finally:
        stop(proc)
        log.close()


def _stat(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:  # gone meanwhile
        return None


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def python_speed() -> float:
    """Seconds of CPU this interpreter takes for ten million additions in a loop: how fast this
    machine runs Python right now (a turn's cost is mostly Python), printed beside the raw commit
    rate so that figures from different machines, or one machine under other load, compare."""
    start = time.process_time()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.process_time() - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far (Linux ``/proc``);
    0 if it is gone."""
    fields = _stat(str(pid))
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_role(roles: dict) -> dict[str, dict[int, float]]:
    """CPU seconds (user + system, Linux ``/proc``) used so far by each role's processes, by
    pid, with what their ended children used (the kernel adds a child's to its parent's when
    the parent reaps it): ``roles`` maps a name to ``("pgid", N)`` (a process group: a qcluster
    and the workers it forked, which django-q2 replaces every ``recycle`` tasks), ``("pid", N)``
    or ``("comm", NAME)`` (every process of that name: PostgreSQL's postmaster and backends,
    redis-server). ``cpu_used`` gives what was used between two readings."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {name: {} for name in roles}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        fields = _stat(pid)
        if fields is None:
            continue
        for name, (kind, value) in roles.items():
            if ((kind == "pgid" and int(fields[2]) == value) or (kind == "pid" and int(pid) == value)
                    or (kind == "comm" and _comm(pid) == value)):
                found[name][int(pid)] = sum(int(f) for f in fields[11:15]) / ticks  # utime stime cutime cstime
    return found


def cpu_used(before: dict, after: dict) -> dict[str, float]:
    """Per role, the CPU seconds used between two ``cpu_by_role`` readings: all of the second
    less all of the first. A process that ended meanwhile (a recycled worker, a PostgreSQL
    backend whose connection closed) is counted by its parent's reaped children, of the same
    role, whole; what it had used by the first reading is taken off with that reading."""
    return {name: sum(after[name].values()) - sum(before[name].values()) for name in after}


def machine_times() -> dict[str, float]:
    """The machine's CPU seconds so far, all cores (Linux ``/proc/stat``): ``busy`` (user,
    system, interrupts), ``idle`` (with I/O wait) and ``steal`` (taken by the hypervisor for
    other guests: a shared host's neighbours). Two readings, subtracted, tell whether the cores
    bounded a run or sat idle — and whether the host took some of them away."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in stat.readline().split()[1:9])
    return {"busy": (user + nice + system + irq + softirq) / ticks, "idle": (idle + iowait) / ticks,
            "steal": steal / ticks}


def run_phase(args, phases: dict) -> bool:
    """In a child process started by ``child`` (``--phase NAME``): set Django up and run that
    phase. Returns whether this process was such a child."""
    if not args.phase:
        return False
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    phases[args.phase](args)
    return True


def child(script: str, phase: str, env: dict, *args: str, timeout: float = 900) -> dict:
    """Run ``bench/<script> --phase <phase>`` in a process of its own (Django reads the
    environment once) and parse the ``key=value`` lines it prints."""
    out = subprocess.run([sys.executable, f"bench/{script}", "--phase", phase, *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(out.stdout + out.stderr)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def table(rows) -> None:
    """Print ``(figure, measured, target)`` rows as a small table."""
    rows = [("figure", "measured", "target"), *rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(3)]
    for i, r in enumerate(rows):
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))
