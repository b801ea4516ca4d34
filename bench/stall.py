#!/usr/bin/env python
"""Plain-read latency while the web process is under stalling load, on this machine.

    .venv/bin/python bench/stall.py [--reads 200] [--blocking 50]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/stall.py

Starts one real daphne process on a throw-away database (a temporary SQLite file, or
``<name>_bench_stall`` next to a PostgreSQL DATABASE_URL) and prints the p50/p99 latency of
``GET /api/projects``:

- idle (the baseline);
- while ``--blocking`` gateway calls ``job_output(block=true)`` wait on a job that never runs
  (no worker; the per-user bound is raised to let them all in, then the job is cancelled);
- while a pathological ``grep`` (``(\\w+\\s?)*$`` over a 25,000-character line) runs in a loop.

Before the web's threads were bounded, the second and third lines were unbounded: the waits and the backtracking
held the one thread all sync views of the process share.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


def read_latencies(client: Client, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        status, _ = client.call("GET", "/api/projects")
        assert status == 200, status
        out.append(time.perf_counter() - start)
    return out


def line(label: str, latencies: list[float]) -> str:
    ms = [x * 1000 for x in latencies]
    return f"{label:<48} p50 {percentile(ms, 0.5):7.1f} ms   p99 {percentile(ms, 0.99):7.1f} ms   (n={len(ms)})"


def setup(workspace: Path):
    """The bench's rows, written through the services: a user, a project with a workspace, an
    OpenWork spec and session, one queued user turn. Returns (token, address, job id)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken
    from accounts.services import create_project
    from collab.services.projects import do_set_workspace
    from collab.services.sessions import do_create_session
    from collab.services.specs import do_create_agent_spec
    from collab.services.turns import do_start_user_turn

    user = get_user_model().objects.create_user("bench", password="bench-secret-123")
    project = create_project(user, slug="bench", name="Bench")
    do_set_workspace(None, project, str(workspace))
    do_create_agent_spec(project, agent_id="ow", provider="scripted", script=[], toolset="openwork")
    session = do_create_session(user, project, title="bench", agent_id="ow")
    job = do_start_user_turn(user, session, "go")
    job.refresh_from_db()
    _, raw = ApiToken.issue(user, name="bench")
    return raw, f"{session.pk}:{job.prompt_msg_id}", job.pk


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--blocking", type=int, default=50)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="trellis-bench-stall-"))
    workspace = scratch / "workspace"
    workspace.mkdir()
    (workspace / "long.txt").write_text("word " * 5000 + "!\n")
    url = os.environ.get("DATABASE_URL", "")
    admin = bench_db = None
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        bench_db = url.rpartition("/")[2] + "_bench_stall"
        admin = url.replace("postgres://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench_db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{bench_db}"')
        url = f"{url.rpartition('/')[0]}/{bench_db}"
    else:
        (scratch / "db").mkdir()
        url = f"sqlite:///{scratch / 'db' / 'bench.sqlite3'}"
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SECRET_KEY="bench", TRELLIS_VAR_DIR=str(scratch / "var"),
               TRELLIS_LOG_LEVEL="WARNING", TRELLIS_QUEUE_NAME=f"bench-stall-{os.getpid()}",
               TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER=str(args.blocking), DJANGO_SETTINGS_MODULE="config.settings")
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env)
    token, address, job_id = setup(workspace)

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        client = Client(f"http://127.0.0.1:{port}", token)
        read_latencies(client, 20)  # warm up
        print(f"[{'postgresql' if bench_db else 'sqlite'}, one daphne process, {os.cpu_count()} cpus]")
        print(line("GET /api/projects, idle", read_latencies(client, args.reads)))

        pool = ThreadPoolExecutor(args.blocking)
        waits = [pool.submit(client.call, "POST", f"/api/branches/{address}/tools/job_output",
                             {"arguments": {"job_id": job_id, "block": True, "timeout": 600_000}})
                 for _ in range(args.blocking)]
        time.sleep(1.0)  # let them all reach their wait
        waiting = sum(not w.done() for w in waits)
        under_wait = read_latencies(client, args.reads)
        print(line(f"GET /api/projects, {waiting} blocking calls waiting", under_wait))
        _, execution = client.call("GET", f"/api/executions/{job_id}")
        client.call("POST", f"/api/executions/{job_id}/commands", {
            "command_id": "bench-release", "action": "execution.cancel", "expected_version": execution["version"],
            "payload": {}})
        released = [w.result()[0] for w in waits]
        pool.shutdown()
        print(f"{'':<48} (the {waiting} waits answered {sorted(set(released))} once the job was cancelled)")

        stop = threading.Event()
        greps = []

        def grep_loop():
            while not stop.is_set():
                start = time.perf_counter()
                status, body = client.call("POST", f"/api/branches/{address}/tools/grep",
                                           {"arguments": {"pattern": r"(\w+\s?)*$"}})
                assert status == 200 and not body["is_error"], body
                greps.append(time.perf_counter() - start)

        grepper = threading.Thread(target=grep_loop)
        grepper.start()
        under_grep = read_latencies(client, args.reads)
        stop.set()
        grepper.join()
        print(line("GET /api/projects, pathological grep looping", under_grep))
        print(line("  the grep calls themselves", greps))
        print(f"{'':<48} mean read {statistics.mean(under_grep) * 1000:.1f} ms")
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        if bench_db:
            import psycopg

            from django.db import connections

            connections.close_all()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{bench_db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
