#!/usr/bin/env python
"""Turn overhead and admission latency (docs/performance.md#targets), measured on this machine in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/admission.py [--turns 200]

Creates a throw-away database ``<name>_bench`` next to DATABASE_URL's, runs a real
``qcluster`` worker against it twice — with the ORM broker, then with the Redis
broker if REDIS_URL is set — and prints, for each:

- the machine's raw single-row INSERT+COMMIT rate (psycopg, same server, same run);
- admissions/s (user turns admitted through the service, one per session);
- turns/s end to end (scripted model, zero latency) and its ratio to the raw rate;
- enqueue→start latency p50/p99 (Job.created_at → started_at) of turns admitted one at a
  time on an idle worker;
- commits per turn, traced on one turn run in-process (admission + claim + completion,
  counting transactions that write; the broker's own commits are not included).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pg_url(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


def raw_insert_rate(url: str, n: int = 2000) -> float:
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw; CREATE TABLE bench_raw (id bigserial primary key, v text)")
        start = time.perf_counter()
        for i in range(n):
            conn.execute("INSERT INTO bench_raw (v) VALUES (%s)", (f"row {i}",))
        elapsed = time.perf_counter() - start
        conn.execute("DROP TABLE bench_raw")
    return n / elapsed


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run(broker: str, url: str, redis_url: str, turns: int, workers: int) -> dict:
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SECRET_KEY="bench", TRELLIS_WORKERS=str(workers),
               TRELLIS_QUEUE_NAME=f"bench-{broker}-{os.getpid()}", TRELLIS_LOG_LEVEL="WARNING")
    if broker == "redis":
        env["REDIS_URL"] = redis_url
    else:
        env.pop("REDIS_URL", None)
    setup = subprocess.run([sys.executable, "bench/_admit.py", "setup", str(turns)], env=env, cwd=ROOT,
                           capture_output=True, text=True)
    if setup.returncode:
        raise SystemExit(setup.stderr)
    worker = subprocess.Popen([sys.executable, "manage.py", "qcluster"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(4)  # cluster start-up is not what we measure
        out = subprocess.run([sys.executable, "bench/_admit.py", "run", str(turns)], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise SystemExit(out.stderr)
    finally:
        worker.terminate()
        worker.wait(20)
    fields = dict(line.split("=", 1) for line in out.stdout.split() if "=" in line)
    latencies = [float(x) for x in fields["latencies"].split(",")]
    return {
        "admit_per_s": float(fields["admit_per_s"]),
        "turns_per_s": float(fields["turns_per_s"]),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL server (postgres://…); a bench database is created next to it")
    import psycopg

    bench_db = url.rpartition("/")[2] + "_bench"
    admin = url.replace("postgres://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{bench_db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{bench_db}"')
    bench_url = pg_url(url, bench_db)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=dict(os.environ, DATABASE_URL=bench_url,
                   DJANGO_SECRET_KEY="bench"), cwd=ROOT, check=True)
    raw = raw_insert_rate(bench_url)
    print(f"raw single-row INSERT+COMMIT: {raw:,.0f}/s")
    env = dict(os.environ, DATABASE_URL=bench_url, DJANGO_SECRET_KEY="bench", TRELLIS_LOG_LEVEL="WARNING")
    env.pop("REDIS_URL", None)
    subprocess.run([sys.executable, "bench/_admit.py", "setup", "1"], env=env, cwd=ROOT, check=True, capture_output=True)
    traced = subprocess.run([sys.executable, "bench/_admit.py", "trace", "1"], env=env, cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    t = dict(line.split("=", 1) for line in traced.split() if "=" in line)
    print(f"commits per turn (traced): {int(t['admission_commits']) + int(t['worker_commits'])} "
          f"(admission {t['admission_commits']}, claim+completion {t['worker_commits']}; {t['queries']} queries); target <= 4")
    brokers = ["orm"] + (["redis"] if os.environ.get("REDIS_URL") else [])
    for broker in brokers:
        r = run(broker, bench_url, os.environ.get("REDIS_URL", ""), args.turns, args.workers)
        print(f"[{broker} broker, {args.workers} workers, {args.turns} turns]")
        print(f"  admissions:           {r['admit_per_s']:,.0f}/s")
        print(f"  turns end to end:     {r['turns_per_s']:,.1f}/s  (ratio to raw commits: {r['turns_per_s'] / raw:.4f})")
        print(f"  enqueue→start (idle): p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{bench_db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
