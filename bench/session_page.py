#!/usr/bin/env python
"""First paint of the session page (the "History" target of docs/performance.md#targets),
measured on this machine.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/session_page.py [--repeat 15]

(without DATABASE_URL it uses a throw-away SQLite file). Creates a throw-away database, writes
two sessions in bulk — 100 messages on 3 branches, and 10,000 messages on 200 branches (forks
at earlier rows, calls and results between branches every few rows, a tenth of the branches
archived) — then times ``GET /s/<id>/`` through the whole Django stack in this process (session
middleware, authorization, every selector, the templates with the DAG's SVG): the HTML a browser
needs for its first paint. Prints the median and p90 of ``--repeat`` runs after one warm-up, the
queries each page costs, and the figure beside the target: 10k-message first paint ≤ 500 ms.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_MS = 500.0


def fresh_database() -> tuple[str, callable]:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        name = url.rpartition("/")[2] + "_session_page"
        admin = url.replace("postgres://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')

        def drop():
            from django.db import connections

            connections.close_all()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        return f"{url.rpartition('/')[0]}/{name}", drop
    directory = tempfile.mkdtemp(prefix="trellis-session-page-")
    return f"sqlite:///{directory}/bench.sqlite3", lambda: None


def build(user, project, n_messages: int, n_branches: int, seed: int = 13):
    """A session written in bulk: main carries about a third of the rows; every other branch forks
    off an earlier row of a random older branch; every 9th row calls the next row of another
    branch (a task) whose result comes back two rows later; every 10th branch is archived."""
    from django.utils import timezone

    from collab.dag_layout import pick_lane
    from collab.models import Branch, Job, Message
    from collab.services.sessions import do_create_session

    rng = random.Random(seed)
    session = do_create_session(user, project, title=f"{n_messages} messages")
    main = session.branches.get()
    t0 = timezone.now() - timedelta(days=2)
    branches, tips, rows, lanes = [main], {}, [], {main.pk: 0}
    step = 0

    def write(branch, pred, **extra):
        nonlocal step
        step += 1
        m = Message(session=session, branch=branch, role=extra.pop("role", rng.choice(("user", "assistant", "tool"))),
                    text=extra.pop("text", "lorem ipsum dolor sit amet " * rng.randint(1, 12)), predecessor=pred,
                    depth=(pred.depth + 1) if pred else 0, created_at=t0 + timedelta(milliseconds=10 * step), **extra)
        rows.append(m)
        tips[branch.pk] = m
        return m

    write(main, None, role="user")
    per_branch_open = max(1, (n_messages - n_messages // 3) // max(n_branches - 1, 1))
    while len(rows) < n_messages:
        if len(branches) < n_branches and len(rows) % per_branch_open == 0:
            parent = rng.choice(branches)
            fork_at = tips[parent.pk]
            branch = Branch(session=session, name=f"agent {len(branches)}", name_stage=3, forked_from=fork_at,
                            created_at=t0 + timedelta(milliseconds=10 * step + 5))
            branch.lane = pick_lane({lanes[b.pk] for b in branches if not getattr(b, "archived", False)}, lanes[parent.pk])
            branch.save()
            lanes[branch.pk] = branch.lane
            branches.append(branch)
            write(branch, fork_at, role="user")
            continue
        branch = main if rng.random() < 0.35 else rng.choice(branches)
        write(branch, tips[branch.pk])
    Message.objects.bulk_create(rows, batch_size=2000)
    for i, branch in enumerate(branches):
        fields = {"tip": tips[branch.pk]}
        if i and i % 10 == 0:
            fields.update(archived=True, archived_at=tips[branch.pk].created_at, archive_reason="bench: done")
        Branch.objects.filter(pk=branch.pk).update(**fields)
    jobs, arrivals = [], []
    for i in range(1, len(rows) - 3, 9):
        caller, target, back = rows[i], rows[i + 1], rows[i + 3]
        if caller.branch_id == target.branch_id:
            continue
        job = Job(project=project, session=session, branch=target.branch, kind="task", status="succeeded",
                  caller_session=session, caller_msg=caller, caller_branch=caller.branch, prompt_msg=target,
                  followup_state="delivered", started_at=t0, finished_at=t0)
        jobs.append(job)
        target.job = job
        back.kind, back.role, back.metadata = "agent_message", "user", {"result_of": job.pk, "status": "succeeded"}
        arrivals.append(back)
    Job.objects.bulk_create(jobs, batch_size=2000)
    Message.objects.bulk_update([j.prompt_msg for j in jobs], ["job"], batch_size=2000)
    Message.objects.bulk_update(arrivals, ["kind", "role", "metadata"], batch_size=2000)
    return session


def measure(client, url: str, repeat: int) -> tuple[list[float], int, int]:
    from django.db import connection

    queries = []
    with connection.execute_wrapper(lambda execute, sql, params, many, context: (queries.append(sql),
                                                                                  execute(sql, params, many, context))[1]):
        response = client.get(url)  # warm-up; its queries are counted
    assert response.status_code == 200, response.status_code
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - start) * 1000)
    return times, len(queries), len(response.content)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--branches", type=int, default=200)
    parser.add_argument("--queries", action="store_true", help="also print each query of the big page with its time")
    args = parser.parse_args()

    url, drop = fresh_database()
    os.environ.update(DATABASE_URL=url, DJANGO_SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "bench"),
                      TRELLIS_LOG_LEVEL="WARNING", DJANGO_SETTINGS_MODULE="config.settings",
                      TRELLIS_VAR_DIR=tempfile.mkdtemp(prefix="trellis-session-page-var-"))
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    try:
        from django.contrib.auth import get_user_model
        from django.template.loader import render_to_string
        from django.test import Client

        from accounts.models import Membership, Project
        from collab.selectors.dag import dag_page

        user = get_user_model().objects.create_user(username="bench", password="bench-pw-123")
        project = Project.objects.create(slug="bench", name="Bench")
        Membership.objects.create(user=user, project=project, role="member")
        started = time.perf_counter()
        from django.db import transaction

        with transaction.atomic():  # branches point at fork rows written in bulk after them
            small = build(user, project, 100, 3)
            big = build(user, project, args.messages, args.branches)
        print(f"built the sessions in {time.perf_counter() - started:.1f} s "
              f"({connection_vendor()}; {args.repeat} timed runs each after a warm-up)")
        client = Client()
        client.force_login(user)
        results = {}
        if args.queries:
            print_queries(client, f"/s/{big.pk}/")
        for label, session in (("100 messages / 3 branches", small),
                               (f"{args.messages:,} messages / {args.branches} branches", big)):
            times, queries, size = measure(client, f"/s/{session.pk}/", args.repeat)
            results[label] = statistics.median(times)
            p90 = sorted(times)[max(0, round(0.9 * (len(times) - 1)))]
            print(f"  {label:<34} first paint (server) median {statistics.median(times):7.1f} ms  p90 {p90:7.1f} ms  "
                  f"{queries} queries  {size / 1024:.0f} KiB")
            graph = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                render_to_string("collab/_dag.html", {"dag": dag_page(session, user), "session": session})
                graph.append((time.perf_counter() - start) * 1000)
            print(f"  {'':<34} of which the graph column      {statistics.median(graph):7.1f} ms")
        big_ms = results[f"{args.messages:,} messages / {args.branches} branches"]
        verdict = "meets" if big_ms <= TARGET_MS else "MISSES"
        print(f"target: the {args.messages:,}-message first paint <= {TARGET_MS:.0f} ms -> {big_ms:.1f} ms ({verdict} it); "
              f"ratio to the 100-message page {big_ms / results['100 messages / 3 branches']:.2f}x")
    finally:
        drop()


def print_queries(client, url: str) -> None:
    """Each query of one request with its time (``--queries``: where a slow page spends it)."""
    from django.db import connection

    def timed(execute, sql, params, many, context):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            print(f"    {(time.perf_counter() - start) * 1000:7.1f} ms  {' '.join(sql.split())[:160]}")

    with connection.execute_wrapper(timed):
        client.get(url)


def connection_vendor() -> str:
    from django.db import connection

    return connection.vendor


if __name__ == "__main__":
    main()
