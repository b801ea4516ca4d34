#!/usr/bin/env python
"""Storage per turn and per message (the "History" target of docs/performance.md#targets: storage
grows linearly, ≈ the text plus a small constant per message),
measured on this machine.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/storage.py \\
      [--messages 1000 [10000 [100000]]]

Creates a throw-away database ``<db>_bench_storage`` next to DATABASE_URL's, then runs real turns
in this process on one branch — each admitted through the service (``do_start_user_turn``) and
run by ``collab.runtime.loop.run_job`` (the claim and completion a worker does), a scripted agent
answering with its prompt, so a turn holds about 400 characters of text (a 200-character prompt
and the same 200 back) — until the branch holds each of the ``--messages`` sizes in turn. At each
size it prints ``pg_total_relation_size`` (rows, TOAST and indexes) summed over the ``collab_*``
tables against the empty database, per turn and per message, and the marginal bytes per turn of
the last stretch (linear growth keeps it flat), twice: as the files stand ("as written": the row
versions left by updates — a job's three state changes, the session's and branch's counters —
count until a vacuum reclaims them), then after ``VACUUM FULL`` of those tables (every dead row
version gone, heaps and indexes rewritten: what the data holds, what stays). At the largest size
it prints which tables hold the bytes as written, and the split after ``VACUUM FULL`` by relation:
each table's heap, its TOAST and each of its indexes. The next stretch grows from the vacuumed
files. Target: ≤ 3 KB per turn of ~400 characters. 100,000 messages take a long while: a flag, not a default.
``--keep`` leaves the bench database in place for a closer look (``pgstattuple``, ``pg_column_size``).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402

TARGET_BYTES_PER_TURN = 3 * 1024
PROMPT = ("Storage bench: the quick brown fox jumps over the lazy dog. " * 4)[:200]

SIZES_SQL = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE 'collab\\_%%'
"""


# every relation of the collab_* tables on its own: "table" (heap with its free-space and
# visibility maps), "table/toast" (TOAST heap and index) and "table/index" for each index
RELATIONS_SQL = """
SELECT c.relname, c.relname, pg_table_size(c.oid) - COALESCE(pg_total_relation_size(c.reltoastrelid), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE 'collab\\_%%'
UNION ALL
SELECT c.relname, c.relname || '/toast', COALESCE(pg_total_relation_size(c.reltoastrelid), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE 'collab\\_%%'
UNION ALL
SELECT c.relname, c.relname || '/' || i.relname, pg_relation_size(i.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_index x ON x.indrelid = c.oid JOIN pg_class i ON i.oid = x.indexrelid
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE 'collab\\_%%'
"""


def sizes() -> dict:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(SIZES_SQL)
        return dict(cur.fetchall())


def relation_sizes() -> dict:
    """{relation: bytes} for every heap, TOAST and index of the collab_* tables."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(RELATIONS_SQL)
        return {name: size for _, name, size in cur.fetchall()}


DEAD_SQL = """
SELECT COALESCE(SUM((pgstattuple(c.oid)).dead_tuple_count), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE 'collab\\_%%'
"""


def vacuum_full(tries: int = 20) -> int:
    """Rewrite every collab_* table and its indexes: dead row versions go, what stays is the data.
    A row version another transaction's snapshot may still see survives VACUUM FULL, so it is run
    again (up to ``tries`` times, 3 s apart) until ``pgstattuple`` counts no dead version left
    (once, when the extension is not installed). Returns the dead versions left (0 normally)."""
    from django.db import connection

    with connection.cursor() as cur:
        try:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")  # the throw-away database's own
        except Exception:
            tries = 1
        cur.execute(SIZES_SQL)
        tables = [table for table, _ in cur.fetchall()]
        dead = 0
        for attempt in range(tries):
            if attempt:
                time.sleep(3)
            for table in tables:
                cur.execute(f'VACUUM FULL "{table}"')
            if tries == 1:
                break
            cur.execute(DEAD_SQL)
            dead = int(cur.fetchone()[0])
            if not dead:
                break
        return dead


def phase_run(args):
    from django.contrib.auth import get_user_model
    from django.db.models import Sum
    from django.db.models.functions import Length

    from accounts.models import Membership, Project
    from collab.models import AgentSpec, Message
    from collab.runtime.loop import run_job
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    user, _ = get_user_model().objects.get_or_create(username="bench")
    project, _ = Project.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    Membership.objects.get_or_create(user=user, project=project, defaults={"role": "owner"})
    AgentSpec.objects.get_or_create(project=project, agent_id="echo", defaults={"script": [{"text": "{{prompt}}"}]})
    session = do_create_session(user, project, title="storage", agent_id="echo")
    vacuum_full()
    base, base_relations = sizes(), relation_sizes()
    turns, last_turns, last_total, start = 0, 0, sum(base.values()), time.perf_counter()
    last_vacuumed = sum(base_relations.values())
    for target in sorted(args.messages):
        while Message.objects.filter(session=session).count() < target:
            for _ in range(50):
                job = do_start_user_turn(user, session, PROMPT)
                run_job(job.pk)
                turns += 1
        now = sizes()
        total = sum(now[t] - base.get(t, 0) for t in now)
        messages = Message.objects.filter(session=session).count()
        chars = Message.objects.filter(session=session).aggregate(c=Sum(Length("text")))["c"] or 0
        marginal = (sum(now.values()) - last_total) / max(turns - last_turns, 1)
        print(f"size{target}={messages},{turns},{total},{chars},{marginal:.0f},{time.perf_counter() - start:.1f}")
        per_table = sorted(((t, (now[t] - base.get(t, 0)) / turns) for t in now), key=lambda x: -x[1])
        dead = vacuum_full()  # what stays at this size; the next stretch grows from there
        after = relation_sizes()
        vacuumed_marginal = (sum(after.values()) - last_vacuumed) / max(turns - last_turns, 1)
        print(f"vacuumed{target}={sum(after.values()) - sum(base_relations.values())},{vacuumed_marginal:.0f},{dead}")
        last_turns, last_total, last_vacuumed = turns, sum(sizes().values()), sum(after.values())
    print("tables=" + ";".join(f"{t}:{b:.0f}" for t, b in per_table if b >= 1))
    per_relation = sorted(((r, (after[r] - base_relations.get(r, 0)) / turns) for r in after), key=lambda x: -x[1])
    print("relations=" + ";".join(f"{r}:{b:.0f}" for r, b in per_relation if b >= 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, nargs="+", default=[1000],
                        help="branch sizes (messages) at which to measure; e.g. 1000 10000 100000")
    parser.add_argument("--keep", action="store_true", help="keep the bench database (its URL is printed)")
    parser.add_argument("--phase", choices=["run"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if _common.run_phase(args, {"run": phase_run}):
        return
    bench_url = _common.create_database("bench_storage")
    try:
        raw = _common.raw_insert_rate(bench_url)
        r = _common.child("storage.py", "run", _common.bench_env(bench_url, "orm", tag="bench-storage"),
                          "--messages", *map(str, args.messages), timeout=24 * 3600)
        rows = [("raw single-row INSERT+COMMIT", f"{raw:,.0f}/s", "(machine)")]
        for size in sorted(args.messages):
            messages, turns, total, chars, marginal, elapsed = r[f"size{size}"].split(",")
            messages, turns, total, chars = int(messages), int(turns), int(total), int(chars)
            label = f"[{messages:,} messages, {turns:,} turns, {chars / turns:.0f} chars/turn]"
            vacuumed, vacuumed_marginal, dead = map(int, r[f"vacuumed{size}"].split(","))
            rows += [
                (f"{label} bytes per turn as written", f"{total / turns:,.0f} B", ""),
                (f"{label} bytes per message as written", f"{total / messages:,.0f} B", ""),
                (f"{label} marginal bytes per turn as written (this stretch)", f"{float(marginal):,.0f} B", "flat"),
                (f"{label} bytes per turn after VACUUM FULL", f"{vacuumed / turns:,.0f} B",
                 f"<= {TARGET_BYTES_PER_TURN:,} B"),
                (f"{label} bytes per message after VACUUM FULL", f"{vacuumed / messages:,.0f} B", ""),
                (f"{label} marginal bytes per turn after VACUUM FULL (this stretch)", f"{vacuumed_marginal:,} B", "flat"),
                (f"{label} turns/s written in-process", f"{turns / float(elapsed):,.1f}/s", ""),
            ]
            if dead:
                rows.append((f"{label} dead row versions another transaction kept through VACUUM FULL", f"{dead:,}", "0"))
        _common.table(rows)
        print("bytes per turn by table (largest size, as written): " + ", ".join(
            f"{t} {b}" for t, b in (x.split(":") for x in r["tables"].split(";"))))
        print("bytes per turn by relation after VACUUM FULL (heap, table/toast, table/index):")
        for relation, b in (x.rsplit(":", 1) for x in r["relations"].split(";")):
            print(f"  {int(b):>6,} B  {relation}")
    finally:
        if args.keep:
            print(f"kept: {bench_url}")
        else:
            _common.drop_database(bench_url)


if __name__ == "__main__":
    main()
