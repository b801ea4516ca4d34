#!/usr/bin/env python
"""Search at size (docs/web-app.md#search): ``collab.selectors.search.search`` over a million
messages on PostgreSQL, measured on this machine in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/search.py \\
      [--messages 1000000] [--sessions 10000] [--queries 200] [--keep]

Creates a throw-away database ``<db>_bench_search`` next to DATABASE_URL's (migrated: the GIN
index of collab's search migration is there) and, in one process:

- writes ``--sessions`` sessions in four projects (one in ten private to someone else: the reader
  may not see it), two branches each, and ``--messages`` messages with one ``COPY`` — the index
  dropped first and built again after, timed (the migration builds it ``CONCURRENTLY`` on a live
  table instead). Each message is 10–80 words drawn from 30,000 made-up words by Zipf's law (a
  word's frequency ∝ 1 / its rank), so a few words are in most messages and most are rare, as in
  prose; one message in five is a tool call (a tool's name and a path among its arguments), one
  in five a tool result.
- searches as a member of the four projects (the visibility rule in full: not a maintainer),
  through the selector the API and the page call (the queries, the rows, redaction, snippets),
  limit 20: a warm-up, then ``--queries`` queries in the proportions of ``MIX`` — a rare word
  (rank 3,000–30,000: in at most 0.15 % of messages) 6 in 20, a common one (rank 20–300: 1.5–20 %)
  6, two words 4, the first four letters of a word (a prefix) 3, a very common one (rank 1–20:
  20–99 %, the words English leaves out as too common, which the ``simple`` index keeps) 1 — and
  prints the p50 and p95 of each kind and of all. Target: p95 ≤ 300 ms.

Prints a table "figure | measured | target", the index's size and build time, and the plan of
the slowest query (``EXPLAIN ANALYZE``).
"""

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, UTC
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402

TARGET_P95_MS = 300.0
VOCABULARY = 30_000
SYLLABLES = [c + v for c in "bdfghklmnprstvwz" for v in "aeiou"]  # 80: a word's first four letters are rare
KINDS = ("rare", "common", "very common", "two words", "prefix")

def words(n: int, rng: random.Random) -> list[str]:
    """``n`` distinct made-up words of two to four syllables."""
    found: dict[str, None] = {}
    while len(found) < n:
        found["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))] = None
    return list(found)


COPY_SQL = ("COPY collab_message (id, session_id, branch_id, role, kind, text, tool_calls, tool_call_id, metadata, "
            "depth, turn, created_at) FROM STDIN")
TOOLS = ("read_file", "grep", "bash", "write_file")


def message_rows(n: int, vocabulary: list[str], branches: list[tuple[str, str]], rng: random.Random):
    """``n`` messages for COPY, oldest first, 15 s apart: 10–80 words drawn by Zipf's law (a word's
    weight 1 / its rank); every fifth a tool call (a tool, a path), every fifth a tool result."""
    weights = list(itertools.accumulate(1 / rank for rank in range(1, len(vocabulary) + 1)))
    start = datetime.now(UTC) - timedelta(seconds=15 * n)
    for g in range(n):
        branch, session = branches[g % len(branches)]
        role, calls, text = ("user", "assistant", "assistant", "tool", "assistant")[g % 5], None, ""
        if g % 5 == 2:
            path = f"src/{rng.choices(vocabulary, cum_weights=weights)[0]}.py"
            calls = json.dumps([{"id": f"call_{g}", "name": TOOLS[g % 4], "arguments": {"path": path}}])
        else:
            text = " ".join(rng.choices(vocabulary, cum_weights=weights, k=rng.randint(10, 80)))
        yield (f"{3_000_000_000 + g:012x}", session, branch, role, "normal", text, calls, "", "{}", 0, 0,
               start + timedelta(seconds=15 * g))


def build(args, rng: random.Random):
    """The projects, people, sessions and branches (the ORM), the messages (one SQL statement)."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.models import Membership, Project
    from collab.models import Branch, Session, Visibility

    vocabulary = words(VOCABULARY, rng)
    User = get_user_model()
    reader = User.objects.create_user(username="reader", password="bench-pw-123")
    other = User.objects.create_user(username="other", password="bench-pw-123")
    projects = [Project.objects.create(slug=f"bench-{i}", name=f"Bench {i}") for i in range(4)]
    for p in projects:
        Membership.objects.create(user=reader, project=p, role="member")
        Membership.objects.create(user=other, project=p, role="member")
    sessions = [Session(project=projects[i % 4], created_by=other if i % 10 == 0 else reader,
                        visibility=Visibility.PRIVATE if i % 10 == 0 else Visibility.PROJECT,
                        title=" ".join(rng.choice(vocabulary[:5000]) for _ in range(3)).capitalize())
                for i in range(args.sessions)]
    Session.objects.bulk_create(sessions, batch_size=5000)
    Branch.objects.bulk_create([Branch(session=s, name=name) for s in sessions
                                for name in ("main", "-".join(rng.choice(vocabulary[:5000]) for _ in range(2)))],
                               batch_size=5000)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        # the index as the migration made it, built again in place after the load (not CONCURRENTLY:
        # nothing else writes here)
        cursor.execute("SELECT pg_get_indexdef('message_search'::regclass)")
        (index_sql,) = cursor.fetchone()
        cursor.execute("DROP INDEX message_search")
        branches = list(Branch.objects.values_list("pk", "session_id"))
        with cursor.cursor.copy(COPY_SQL) as copy:
            for row in message_rows(args.messages, vocabulary, branches, rng):
                copy.write_row(row)
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        cursor.execute("SET maintenance_work_mem = '256MB'")
        cursor.execute(index_sql)
        built = time.perf_counter() - started
        cursor.execute("ANALYZE")
        cursor.execute("SELECT pg_relation_size('message_search'), pg_table_size('collab_message')")
        index_bytes, table_bytes = cursor.fetchone()
    return reader, vocabulary, loaded, built, index_bytes, table_bytes


# what people search for, by weight: mostly a word they remember (rare or common), sometimes two,
# the start of one, now and then one of the few words nearly every message holds
MIX = ("rare",) * 6 + ("common",) * 6 + ("two words",) * 4 + ("prefix",) * 3 + ("very common",)


def queries(vocabulary: list[str], n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` (kind, query) pairs, cycling through ``MIX``."""
    out = []
    for i in range(n):
        kind = MIX[i % len(MIX)]
        if kind == "rare":
            q = rng.choice(vocabulary[3000:])
        elif kind == "common":
            q = rng.choice(vocabulary[20:300])
        elif kind == "very common":
            q = rng.choice(vocabulary[:20])
        elif kind == "two words":
            q = f"{rng.choice(vocabulary[20:3000])} {rng.choice(vocabulary[300:10000])}"
        else:
            q = rng.choice(vocabulary[100:5000])[:4]
        out.append((kind, q))
    return out


def phase_run(args):
    from django.db import connection

    from collab.selectors.search import search

    rng = random.Random(args.seed)
    reader, vocabulary, loaded, built, index_bytes, table_bytes = build(args, rng)
    print(f"load={loaded:.1f}")
    print(f"index={built:.1f},{index_bytes},{table_bytes}")
    for _, q in queries(vocabulary, 20, rng):  # warm-up: the cache, the plans
        search(reader, q)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    slowest = (0.0, "")
    for kind, q in queries(vocabulary, args.queries, rng):
        started = time.perf_counter()
        results = search(reader, q)
        ms = (time.perf_counter() - started) * 1000
        times[kind].append(ms)
        slowest = max(slowest, (ms, q))
        assert all(r["project"].startswith("bench-") for r in results)
    everything = [t for kind in KINDS for t in times[kind]]
    for kind in KINDS:
        print(f"kind_{kind}={_common.percentile(times[kind], 0.5):.1f},{_common.percentile(times[kind], 0.95):.1f},"
              f"{len(times[kind])}")
    print(f"all={_common.percentile(everything, 0.5):.1f},{_common.percentile(everything, 0.95):.1f},"
          f"{max(everything):.1f},{statistics.mean(everything):.1f},{len(everything)}")
    print(f"slowest={slowest[1]}")
    # the slowest query's candidate statements, as the selector sends them: one a window until one
    # holds enough matches; each one's rows and time, and the plan of the costliest
    from collab.access import visible_sessions
    from collab.selectors.search import CANDIDATES, candidates_statements, search_terms

    plans = []
    with connection.cursor() as cursor:
        for sql, params in candidates_statements(visible_sessions(reader), search_terms(slowest[1])):
            cursor.execute(sql, params)
            rows = len(cursor.fetchall())
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            plan = [line for (line,) in cursor.fetchall()]
            ms = float(next(line for line in plan if line.startswith("Execution Time")).split()[2])
            print(f"window{len(plans)}={rows},{ms:.1f}")
            plans.append((ms, plan))
            if rows >= CANDIDATES:
                break
    for i, line in enumerate(max(plans)[1]):
        print(f"plan{i:03d}=  {line}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="leave the bench database in place for a closer look")
    parser.add_argument("--phase", choices=["run"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if _common.run_phase(args, {"run": phase_run}):
        return
    bench_url = _common.create_database("bench_search")
    try:
        forwarded = ["--messages", str(args.messages), "--sessions", str(args.sessions), "--queries",
                     str(args.queries), "--seed", str(args.seed)]
        started = time.perf_counter()
        r = _common.child("search.py", "run", _common.bench_env(bench_url, "orm", tag="bench-search"), *forwarded,
                          timeout=3 * 3600)
        built, index_bytes, table_bytes = r["index"].split(",")
        rows = [(f"{args.messages:,} messages written (COPY, no index)", f"{float(r['load']):.0f} s", ""),
                ("GIN index built", f"{float(built):.0f} s, {int(index_bytes) / 2**20:,.0f} MiB "
                 f"(table {int(table_bytes) / 2**20:,.0f} MiB)", "")]
        for kind in KINDS:
            p50, p95, n = r[f"kind_{kind}"].split(",")
            rows.append((f"search, {kind} ({n} queries)", f"p50 {float(p50):.0f} ms, p95 {float(p95):.0f} ms", ""))
        p50, p95, worst, mean, n = r["all"].split(",")
        rows.append((f"search, all {n} queries, limit 20", f"p50 {float(p50):.0f} ms, p95 {float(p95):.0f} ms, "
                     f"max {float(worst):.0f} ms", f"p95 <= {TARGET_P95_MS:.0f} ms"))
        _common.table(rows)
        windows = [r[k].split(",") for k in sorted(k for k in r if k.startswith("window"))]
        print(f"\nthe slowest query, {r['slowest']!r}: its statements for the newest matches, one a window "
              f"(rows, ms): {', '.join(f'{n} in {float(ms):.0f}' for n, ms in windows)}; the costliest's plan:")
        print("\n".join(r[key] for key in sorted(k for k in r if k.startswith("plan"))))
        print(f"\n(the whole run: {time.perf_counter() - started:.0f} s)")
    finally:
        if not args.keep:
            _common.drop_database(bench_url)


if __name__ == "__main__":
    main()
