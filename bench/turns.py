#!/usr/bin/env python
"""Turns end to end (the "Turn overhead" target of docs/performance.md#targets),
measured on this machine in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/14 \\
      .venv/bin/python bench/turns.py [--turns 100] [--workers 2] [--web daphne|testclient] [--brokers orm redis] [--history N]
    .venv/bin/python bench/turns.py --stock NAME [--pairs 3] [--brokers orm|redis] [--base NAMES]   # A/B one bypass

Creates a throw-away database ``<db>_bench_turns`` next to DATABASE_URL's and prints, in one
table beside the targets:

- the machine's raw single-row INSERT+COMMIT rate (psycopg, same server, same run);
- queries and commits per turn, traced on a session's first and second turn run in this process
  (admission through the service, then ``collab.runtime.loop.run_job``: the claim and the
  completion; Django's ``CaptureQueriesContext``; the broker's own queue writes not counted);
- for the ORM broker, and the Redis broker when REDIS_URL is set, with a real ``qcluster``
  of ``--workers`` workers:
  - sequential: ``--turns`` turns one after another on one branch, each submitted through the
    public API (``POST /api/sessions/{sid}/turns?wait=30``, bearer token) to a real daphne process
    (``config.asgi``, the way a client reaches a deployment; one kept-alive HTTP connection), or
    with ``--web testclient`` to Django's test client in the measuring process (as before: it
    runs each async request on an event loop of its own, so every request also opened its own
    Redis connections), and timed until the answer says the execution is terminal —
    submit→visible p50/p99, no polling (the environment reaches every process: run it with
    ``DB_POOL_MAX_SIZE=8`` to time the web process with its connection pool);
    ``--history N`` first runs N turns on that branch (in-process, untimed), so the p50 is taken
    on a branch of N turns: the target is the same at 1,000 and at 10,000 (flat);
  - concurrent: ``--turns`` turns submitted through the API at once by ``--clients`` clients
    (default 8, each on its own connection), one turn per session, then
    turns/s (first admission → last finish, from the jobs' own timestamps) and p50/p99 of
    each job's admission → terminal.

``--stock NAME`` instead times ``--pairs`` pairs of runs (sequential p50, turns/s, CPU per turn of
the web process and of the workers), one on Trellis's path and one with ``TRELLIS_STOCK=NAME``
(docs/infrastructure.md), in alternating order, and prints the medians beside the spread of
Trellis's own runs (the host's drift). ``--base NAMES`` (comma-separated) switches those bypasses
to the stock path on both sides: a bypass that only acts where another is off (``push_loop``
where ``channel_layer`` is off) is timed against that other's stock path.
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402

TARGET_QUERIES = 20
TARGET_TURNS_PER_S = 100
TARGET_SEQ_P50_MS = 30
LOAD_GENERATOR = "load generator"
PROMPT = ("The quick brown fox jumps over the lazy dog; " * 9)[:400]


def phase_trace(_args):
    """Two turns on one branch in this process, queries and commits of each (``bench/_admit.py
    trace``): the first turn of a session, then a later one (the steady state)."""
    import contextlib
    import io

    from bench import _admit

    _admit.setup(1)
    first = io.StringIO()
    with contextlib.redirect_stdout(first):
        _admit.trace(1)
    print("\n".join("first_" + line for line in first.getvalue().split()))
    _admit.trace(1)


def _client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.models import ApiToken, TokenScope

    user = get_user_model().objects.get(username="bench")
    _, raw = ApiToken.issue(user, name="bench", scopes=TokenScope.values)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="localhost")


class _Http:
    """A bearer-token JSON client on one kept-alive HTTP connection to the daphne at ``url``."""

    def __init__(self, url: str, token: str):
        import http.client
        import urllib.parse

        parsed = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        self.conn.request("POST", path, json.dumps(body).encode(), self.headers)
        response = self.conn.getresponse()
        return response.status, response.read()


def _submit_all(args, client, sessions: list) -> list[str]:
    """One turn on each session, submitted at once by ``--clients`` clients (threads, each on its
    own kept-alive connection to the web process), so that one client's round trips do not bound
    the rate; the execution ids. With the test client: one after another, in this process."""
    from concurrent.futures import ThreadPoolExecutor

    token = client.defaults["HTTP_AUTHORIZATION"].split()[1]

    def post(http, sid):
        status, content = http.post(f"/api/sessions/{sid}/turns", {"prompt": PROMPT})
        if status != 202:
            raise SystemExit(f"POST /api/sessions/{sid}/turns: {status} {content[:500]!r}")
        return json.loads(content)["execution_id"]

    if not args.url:
        ids = []
        for sid in sessions:
            r = client.post(f"/api/sessions/{sid}/turns", {"prompt": PROMPT}, content_type="application/json")
            if r.status_code != 202:
                raise SystemExit(f"POST /api/sessions/{sid}/turns: {r.status_code} {r.content[:500]!r}")
            ids.append(r.json()["execution_id"])
        return ids
    k = max(1, min(args.clients, len(sessions)))
    shares = [sessions[i::k] for i in range(k)]

    def run(share):
        http = _Http(args.url, token)
        return [post(http, sid) for sid in share]

    with ThreadPoolExecutor(k) as pool:
        return [pk for ids in pool.map(run, shares) for pk in ids]


def _seed_history(sid: str, turns: int) -> None:
    """``turns`` turns on the session's branch before the timed ones (``--history``: the target is
    flat at 1,000 and 10,000 turns on one branch), each admitted through the service and run by
    ``run_job`` in this process, as a worker runs it (the admission's hand-off to the broker is
    dropped: no worker sees them)."""
    from django.contrib.auth import get_user_model

    from collab.access import access_session
    from collab.runtime.loop import run_job
    from collab.services import admission, naming
    from collab.services.turns import do_start_user_turn

    user = get_user_model().objects.get(username="bench")
    handed = admission.async_task, naming.async_task
    admission.async_task = naming.async_task = lambda *a, **k: None
    try:
        for _ in range(turns):
            job = do_start_user_turn(user, access_session(user, sid, "turn.start"), PROMPT)
            if run_job(job.pk) != "succeeded":
                raise SystemExit(f"a history turn did not succeed: {job.pk}")
    finally:
        admission.async_task, naming.async_task = handed


def phase_run(args):
    from bench import _admit
    from collab.models import TERMINAL_STATUSES, Job, Session

    n = args.turns
    _admit.setup(n)  # n + 30 sessions of the scripted echo agent, one turn per session
    client = _client()
    http = _Http(args.url, client.defaults["HTTP_AUTHORIZATION"].split()[1]) if args.url else None
    sessions = list(Session.objects.order_by("created_at").values_list("pk", flat=True))
    seq_session, concurrent = sessions[-1], sessions[:n]

    def submit(sid, wait=None):
        path = f"/api/sessions/{sid}/turns" + (f"?wait={wait}" if wait else "")
        if http:
            status, content = http.post(path, {"prompt": PROMPT})
        else:
            r = client.post(path, {"prompt": PROMPT}, content_type="application/json")
            status, content = r.status_code, r.content
        if status != 202:
            raise SystemExit(f"POST {path}: {status} {content[:500]!r}")
        return json.loads(content)

    if args.history:
        _seed_history(seq_session, args.history)
    submit(sessions[-2], wait=30)  # warm-up: first request builds the middleware chain
    latencies, marks = [], []
    for _ in range(n):
        sent, start = time.time(), time.perf_counter()
        body = submit(seq_session, wait=30)
        if body["status"] not in TERMINAL_STATUSES:
            raise SystemExit(f"turn not terminal after the wait: {body}")
        latencies.append(time.perf_counter() - start)
        marks.append((body["execution_id"], sent, time.time()))
    # where a sequential turn's time goes, from the job's own timestamps (the database's clock, on
    # this machine): submit → admitted (created_at), → claimed (started_at), → ended (finished_at),
    # → the answer back at the client
    stamps = {pk: (c.timestamp(), s.timestamp(), f.timestamp()) for pk, c, s, f in
              Job.objects.filter(pk__in=[m[0] for m in marks]).values_list("pk", "created_at", "started_at", "finished_at")}
    split = [(stamps[pk][0] - sent, stamps[pk][1] - stamps[pk][0], stamps[pk][2] - stamps[pk][1], back - stamps[pk][2])
             for pk, sent, back in marks]
    print("seq_split=" + ";".join(",".join(f"{x:.5f}" for x in row) for row in split))
    # this process too (the clients' threads and the end check): not the platform's, but it runs on
    # the same cores, so what it takes is what the measured rate falls short of their ceiling by
    roles = {**json.loads(args.cpu_roles or "{}"), LOAD_GENERATOR: ["pid", os.getpid()]}
    cpu_before, machine_before = _common.cpu_by_role(roles), _common.machine_times()
    start = time.perf_counter()
    ids = _submit_all(args, client, concurrent)
    submit_elapsed = time.perf_counter() - start
    deadline = time.monotonic() + 600
    # the end is only detected here (the rate comes from the jobs' own timestamps), so the check is
    # rare: each is a query over every id, and its CPU (this process's backend's) would be counted
    # as the platform's and taken from the turns on this machine's two cores
    while Job.objects.filter(pk__in=ids).exclude(status__in=TERMINAL_STATUSES).exists():
        if time.monotonic() > deadline:
            raise SystemExit("concurrent turns did not finish")
        time.sleep(0.25)
    used = _common.cpu_used(cpu_before, _common.cpu_by_role(roles))
    machine = _common.machine_times()
    print("machine=" + ",".join(f"{k}:{machine[k] - machine_before[k]:.3f}" for k in machine))
    print("cpu=" + ",".join(f"{name}:{used[name] / n * 1000:.2f}" for name in roles))
    rows = list(Job.objects.filter(pk__in=ids).values_list("created_at", "finished_at", "status"))
    failed = sum(1 for r in rows if r[2] != "succeeded")
    span = (max(r[1] for r in rows) - min(r[0] for r in rows)).total_seconds()
    print("seq=" + ",".join(f"{x:.5f}" for x in latencies))
    print("conc=" + ",".join(f"{(r[1] - r[0]).total_seconds():.5f}" for r in rows))
    print(f"turns_per_s={len(rows) / span}")
    print(f"submit_per_s={n / submit_elapsed}")
    print(f"failed={failed}")


@contextlib.contextmanager
def _web(env: dict, web: str):
    """The URL and pid of a daphne process started for the block (``--web daphne``), else Nones."""
    if web != "daphne":
        yield None, None
        return
    from bench.live import daphne, free_port

    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = daphne(env, port, log)
        try:
            yield f"http://127.0.0.1:{port}", proc.pid
        finally:
            _common.stop(proc, 15)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100, help="turns in the sequential and in the concurrent run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8,
                        help="clients submitting the concurrent turns at once (each its own connection)")
    parser.add_argument("--web", choices=["daphne", "testclient"], default="daphne",
                        help="where the turns are submitted: a real daphne process, or Django's test client")
    parser.add_argument("--brokers", nargs="+", choices=["orm", "redis"], default=["orm", "redis"],
                        help="the brokers to time (redis only with REDIS_URL)")
    parser.add_argument("--history", type=int, default=0,
                        help="turns run on the sequential branch before the timed ones (in-process, untimed)")
    parser.add_argument("--phase", choices=["trace", "run"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-roles", help=argparse.SUPPRESS)
    parser.add_argument("--stock", metavar="NAME",
                        help="A/B: alternate runs on Trellis's path and with TRELLIS_STOCK=NAME (docs/infrastructure.md)")
    parser.add_argument("--pairs", type=int, default=3, help="with --stock: A/B pairs, in alternating order")
    parser.add_argument("--base", default="", metavar="NAMES",
                        help="with --stock: TRELLIS_STOCK names set on both sides (comma-separated)")
    args = parser.parse_args()
    if _common.run_phase(args, {"trace": phase_trace, "run": phase_run}):
        return
    if args.stock:
        return stock_ab(args)
    bench_url = _common.create_database("bench_turns")
    try:
        raw = _common.raw_insert_rate(bench_url)
        t = _common.child("turns.py", "trace", _common.bench_env(bench_url, "orm"))
        commits = int(t["admission_commits"]) + int(t["worker_commits"])
        first_commits = int(t["first_admission_commits"]) + int(t["first_worker_commits"])
        rows = [
            ("raw single-row INSERT+COMMIT", f"{raw:,.0f}/s", "(machine)"),
            ("Python: 10M additions in a loop", f"{_common.python_speed():.2f} s CPU", "(machine)"),
            ("statements per turn (2nd turn of a branch)", t["statements"], f"<= {TARGET_QUERIES}"),
            ("queries per turn (traced: with BEGIN/COMMIT and the broker's row)", t["queries"], ""),
            ("commits per turn (traced, 2nd turn of a branch)", f"{commits} (admission {t['admission_commits']}, "
             f"claim+completion {t['worker_commits']})", "<= 4 (limit 3)"),
            ("queries / commits of a session's 1st turn", f"{t['first_queries']} / {first_commits}", ""),
        ]
        brokers = [b for b in args.brokers if b == "orm" or os.environ.get("REDIS_URL")]
        for broker in brokers:
            env = _common.bench_env(bench_url, broker, args.workers, tag="bench-turns")
            with _common.worker(env) as cluster, _web(env, args.web) as (url, web_pid):
                # whose CPU a turn costs (the test client runs in the measuring process, not counted)
                roles = {**({"web": ("pid", web_pid)} if web_pid else {}), "workers": ("pgid", cluster.pid),
                         "postgres": ("comm", "postgres"), "redis": ("comm", "redis-server")}
                r = _common.child("turns.py", "run", env, "--turns", str(args.turns), "--cpu-roles", json.dumps(roles),
                                  "--clients", str(args.clients), "--history", str(args.history),
                                  *(["--url", url] if url else []))
            seq = [float(x) * 1000 for x in r["seq"].split(",")]
            conc = [float(x) * 1000 for x in r["conc"].split(",")]
            tps = float(r["turns_per_s"])
            label = f"[{broker}, {args.workers} workers, {args.turns} turns, {args.web}]"
            slabel = label if not args.history else \
                f"[{broker}, {args.workers} workers, {args.turns} turns after {args.history:,} on the branch, {args.web}]"
            clabel = f"[{broker}, {args.workers} workers, {args.turns} turns, {args.web}, {args.clients} clients]"
            split = [[float(x) * 1000 for x in row.split(",")] for row in r["seq_split"].split(";")]
            parts = ("submit→admitted", "admitted→claimed", "claimed→ended", "ended→answer")
            rows += [
                (f"{slabel} sequential submit→visible p50", f"{_common.percentile(seq, 0.5):.0f} ms",
                 f"<= {TARGET_SEQ_P50_MS} ms"),
                (f"{slabel} sequential submit→visible p99", f"{_common.percentile(seq, 0.99):.0f} ms", ""),
                (f"{slabel} sequential p50 of each part", ", ".join(
                    f"{part} {_common.percentile([row[i] for row in split], 0.5):.1f} ms" for i, part in enumerate(parts)),
                 ""),
                (f"{clabel} concurrent turns/s", f"{tps:,.1f}/s (ratio to raw commits {tps / raw:.4f})",
                 f">= {TARGET_TURNS_PER_S}/s"),
                (f"{clabel} concurrent submissions/s (the clients' POSTs answered 202)",
                 f"{float(r['submit_per_s']):,.1f}/s", ""),
                (f"{label} concurrent admission→terminal p50", f"{_common.percentile(conc, 0.5):.0f} ms", ""),
                (f"{label} concurrent admission→terminal p99", f"{_common.percentile(conc, 0.99):.0f} ms", ""),
            ]
            cpu = {name: float(ms) for name, ms in (part.split(":") for part in r["cpu"].split(","))}
            rows.append((f"{label} concurrent CPU per turn", ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items()),
                         ""))
            # what the machine's cores allow at the platform's cost (the load generator's aside): the
            # rate to expect when nothing but CPU bounds it, to read the measured rate against
            platform = sum(ms for name, ms in cpu.items() if name != LOAD_GENERATOR)
            rows.append((f"{label} turns/s this machine's {os.cpu_count()} cores allow at the platform's CPU per turn",
                         f"{os.cpu_count() * 1000 / platform:,.1f}/s", f">= {TARGET_TURNS_PER_S}/s"))
            # the whole machine over the same stretch: cores busy, idle, or taken by the host
            machine = {k: float(v) for k, v in (part.split(":") for part in r["machine"].split(","))}
            whole = sum(machine.values()) or 1
            rows.append((f"{label} the machine's cores over the concurrent run (all processes)",
                         ", ".join(f"{k} {machine[k] / whole:.0%}" for k in ("busy", "idle", "steal")), ""))
            if int(r["failed"]):
                rows.append((f"{label} turns not succeeded", r["failed"], "0"))
        _common.table(rows)
    finally:
        _common.drop_database(bench_url)


def _one_run(args, bench_url: str, broker: str, stock: str) -> dict:
    """One run of the timed phase with its own worker and web process, ``TRELLIS_STOCK=stock``."""
    env = _common.bench_env(bench_url, broker, args.workers, tag="bench-turns")
    env.pop("TRELLIS_STOCK", None)
    if stock:
        env["TRELLIS_STOCK"] = stock
    with _common.worker(env) as cluster, _web(env, args.web) as (url, web_pid):
        roles = {**({"web": ("pid", web_pid)} if web_pid else {}), "workers": ("pgid", cluster.pid)}
        r = _common.child("turns.py", "run", env, "--turns", str(args.turns), "--cpu-roles", json.dumps(roles),
                          "--clients", str(args.clients), "--history", "0", *(["--url", url] if url else []))
    cpu = {name: float(ms) for name, ms in (part.split(":") for part in r["cpu"].split(","))}
    return {"seq p50 ms": _common.percentile([float(x) * 1000 for x in r["seq"].split(",")], 0.5),
            "turns/s": float(r["turns_per_s"]), "web CPU ms/turn": cpu.get("web", 0.0),
            "workers CPU ms/turn": cpu.get("workers", 0.0), "failed": int(r["failed"])}


def stock_ab(args) -> None:
    """``--stock NAME``: ``--pairs`` pairs of runs, one on Trellis's path (A) and one with
    ``TRELLIS_STOCK=NAME`` (B), in alternating order (A B, B A, …) in one process and database, so
    that the host's drift over the run falls on both alike. Prints each run, the medians, B
    against A, and the drift: the spread of A's own runs, which a difference must exceed."""
    import statistics

    broker = next((b for b in args.brokers if b == "orm" or os.environ.get("REDIS_URL")), "orm")
    bench_url = _common.create_database("bench_turns")
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    try:
        for pair in range(args.pairs):
            for side in (("A", "B") if pair % 2 == 0 else ("B", "A")):
                stock = ",".join(filter(None, (args.base, args.stock if side == "B" else "")))
                runs[side].append(_one_run(args, bench_url, broker, stock))
    finally:
        _common.drop_database(bench_url)
    label = f"[{broker}, {args.workers} workers, {args.turns} turns, {args.web}]"
    rows = []
    base = f"TRELLIS_STOCK={args.base}" if args.base else "Trellis's path"
    for side, name in (("A", base), ("B", f"TRELLIS_STOCK={','.join(filter(None, (args.base, args.stock)))}")):
        for i, run in enumerate(runs[side], 1):
            rows.append((f"{label} {name}, run {i}", ", ".join(
                f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in run.items()), ""))
    for metric in ("seq p50 ms", "turns/s", "web CPU ms/turn", "workers CPU ms/turn"):
        a = [run[metric] for run in runs["A"]]
        b = [run[metric] for run in runs["B"]]
        ma, mb = statistics.median(a), statistics.median(b)
        drift = (max(a) - min(a)) / ma if ma else 0.0
        change = (mb - ma) / ma if ma else 0.0
        rows.append((f"{label} {metric}: median A / B", f"{ma:,.2f} / {mb:,.2f} (B {change:+.1%} of A; "
                     f"A's own spread {drift:.1%})", "a gain beyond the spread earns the bypass its place"))
    _common.table(rows)


if __name__ == "__main__":
    main()
