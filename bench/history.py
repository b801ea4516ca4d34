#!/usr/bin/env python
"""History at size (the "History" target of docs/performance.md#targets),
measured on this machine in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/history.py \\
      [--sizes 1000 10000 100000] [--repeat 15] [--branches 10000] [--no-page]

Creates a throw-away database ``<db>_bench_history`` next to DATABASE_URL's and, in one process:

- grows one branch, written in bulk (turns of four nodes: prompt, tool call, tool result,
  answer), to each of ``--sizes`` messages, and at each size times ``read_conversation``'s
  rendering of the last ten turns (``selectors.transcript.render_transcript(start_turn=-10)``,
  what the tool returns) and counts its queries. Target: at 100k within 2× of 1k.
- at the largest size, forks at nodes of several depths — the root, the middle, the tip — the
  way a person does (``services.turns.do_fork_and_start``: a new branch and its first turn
  admitted, one transaction) and times and counts each. Target: O(1), the same at every depth.
- writes ``--branches`` branches (one node each) into another session and runs ``list_agents``
  (``selectors.agents.list_agents`` + ``render_agents``, limit 200) in each scope. Target:
  ≤ 5 queries with 10,000 branches.
- the session page's first paint at 10,000 messages on 200 branches (``bench/session_page.py``'s
  bulk-written session and measurement, through the whole Django stack). Target: ≤ 500 ms.

Prints a table "figure | measured | target" with the machine's raw single-row INSERT+COMMIT
rate from the same run.
"""

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402

TARGET_READ_RATIO = 2.0
TARGET_LIST_AGENTS_QUERIES = 5
TARGET_PAGE_MS = 500.0


def timed(fn, repeat: int) -> tuple[float, int]:
    """(median ms of ``repeat`` runs after a warm-up, queries of the warm-up run)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), len(queries)


class Grower:
    """One branch grown in bulk, turn by turn, continuing its own chain."""

    def __init__(self, session, branch):
        from django.utils import timezone

        self.session, self.branch, self.tip, self.count = session, branch, None, 0
        self.t0 = timezone.now() - timedelta(days=30)

    def grow_to(self, n: int) -> None:
        from collab.models import Branch, Message

        rows = []
        tip = self.tip
        while self.count + len(rows) < n:
            step = (self.count + len(rows)) % 4
            role, extra = [("user", {}), ("assistant", {"tool_calls": [{"id": "c", "name": "todo_list", "arguments": {}}]}),
                           ("tool", {"tool_call_id": "c", "metadata": {"tool": "todo_list"}}),
                           ("assistant", {})][step]
            depth = tip.depth + 1 if tip else 0
            turn = (tip.turn if tip else 0) + (1 if step == 0 else 0)
            tip = Message(session=self.session, branch=self.branch, predecessor=tip, role=role, depth=depth, turn=turn,
                          text=f"history bench node {depth}: " + "lorem ipsum dolor sit amet " * 6,
                          created_at=self.t0 + timedelta(milliseconds=depth), **extra)
            rows.append(tip)
        Message.objects.bulk_create(rows, batch_size=5000)
        self.count += len(rows)
        self.tip = tip
        Branch.objects.filter(pk=self.branch.pk).update(tip=tip, chars=self.count * 180)
        self.branch.refresh_from_db()


def phase_run(args):
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.models import Membership, Project
    from bench import session_page
    from collab.models import Branch, Message
    from collab.selectors.agents import list_agents, render_agents
    from collab.selectors.transcript import render_transcript
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_fork_and_start

    settings.ALLOWED_HOSTS = ["*"]
    user = get_user_model().objects.create_user(username="bench", password="bench-pw-123")
    project = Project.objects.create(slug="bench", name="Bench")
    Membership.objects.create(user=user, project=project, role="owner")

    # read_conversation(start_turn=-10) at each size, on one branch grown in bulk
    session = do_create_session(user, project, title="history")
    grower = Grower(session, session.branches.get())
    for size in sorted(args.sizes):
        started = time.perf_counter()
        grower.grow_to(size)
        built = time.perf_counter() - started
        branch = Branch.objects.get(pk=grower.branch.pk)
        ms, queries = timed(lambda branch=branch: render_transcript(branch, viewer=user, start_turn=-10), args.repeat)
        print(f"read{size}={ms:.3f},{queries},{built:.1f}")

    # forks at several depths of the largest branch, as a person forks (a branch and its first turn)
    tip = grower.tip
    depths = sorted({0, tip.depth // 100, tip.depth // 2, tip.depth})
    for depth in depths:
        node = Message.objects.get(branch=grower.branch, depth=depth)
        ms, queries = timed(lambda node=node: do_fork_and_start(user, session, node, "fork bench prompt"), args.repeat)
        print(f"fork{depth}={ms:.3f},{queries}")

    # list_agents with --branches branches in one session
    many = do_create_session(user, project, title="many branches")
    t0 = grower.t0
    branches = [Branch(session=many, name=f"agent {i}", name_stage=3, lane=i % 8,
                       created_at=t0 + timedelta(seconds=i), last_active_at=t0 + timedelta(seconds=i),
                       archived=(i % 10 == 9), archived_at=(t0 if i % 10 == 9 else None))
                for i in range(args.branches)]
    Branch.objects.bulk_create(branches, batch_size=5000)
    nodes = [Message(session=many, branch=b, role="user", depth=0, turn=1, text=f"hello agent {i} " * 8,
                     created_at=t0 + timedelta(seconds=i)) for i, b in enumerate(branches)]
    Message.objects.bulk_create(nodes, batch_size=5000)
    for b, m in zip(branches, nodes):
        b.tip = m
    Branch.objects.bulk_update(branches, ["tip"], batch_size=5000)
    for scope in ("session", "all", "archived"):
        ms, queries = timed(lambda scope=scope: render_agents(list_agents(user, many, scope=scope, limit=200)),
                            args.repeat)
        print(f"agents_{scope}={ms:.3f},{queries}")

    if not args.no_page:
        from django.db import transaction

        with transaction.atomic():  # session_page.build writes branches before the fork rows they point at
            big = session_page.build(user, project, 10_000, 200)
        client = Client()
        client.force_login(user)
        times, queries, size = session_page.measure(client, f"/s/{big.pk}/", args.repeat)
        print(f"page={statistics.median(times):.3f},{queries},{size}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000],
                        help="branch sizes (messages) at which read_conversation is timed")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--branches", type=int, default=10_000, help="branches in list_agents' session")
    parser.add_argument("--no-page", action="store_true", help="skip the session page's first paint")
    parser.add_argument("--phase", choices=["run"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if _common.run_phase(args, {"run": phase_run}):
        return
    bench_url = _common.create_database("bench_history")
    try:
        raw = _common.raw_insert_rate(bench_url)
        forwarded = ["--sizes", *map(str, args.sizes), "--repeat", str(args.repeat), "--branches", str(args.branches)]
        r = _common.child("history.py", "run", _common.bench_env(bench_url, "orm", tag="bench-history"),
                          *forwarded, *(["--no-page"] if args.no_page else []), timeout=4 * 3600)
        rows = [("raw single-row INSERT+COMMIT", f"{raw:,.0f}/s", "(machine)")]
        sizes = sorted(args.sizes)
        reads = {s: r[f"read{s}"].split(",") for s in sizes}
        for s in sizes:
            ms, queries, _built = reads[s]
            target = f"<= {TARGET_READ_RATIO:.0f}x the {sizes[0]:,}-message figure" if s != sizes[0] else ""
            ratio = f" ({float(ms) / float(reads[sizes[0]][0]):.2f}x)" if s != sizes[0] else ""
            rows.append((f"read_conversation(start_turn=-10) at {s:,} messages", f"{float(ms):.1f} ms{ratio}, "
                         f"{queries} queries", target))
        forks = sorted(((int(k[4:]), v.split(",")) for k, v in r.items() if k.startswith("fork")))
        for depth, (ms, queries) in forks:
            rows.append((f"fork + first turn at depth {depth:,} (of a {sizes[-1]:,}-message branch)",
                         f"{float(ms):.1f} ms, {queries} queries", "O(1): the same at every depth"))
        for scope in ("session", "all", "archived"):
            ms, queries = r[f"agents_{scope}"].split(",")
            rows.append((f"list_agents scope={scope}, {args.branches:,} branches (limit 200)",
                         f"{queries} queries, {float(ms):.1f} ms", f"<= {TARGET_LIST_AGENTS_QUERIES} queries"))
        if "page" in r:
            ms, queries, size = r["page"].split(",")
            rows.append(("session page first paint, 10,000 messages / 200 branches (server)",
                         f"{float(ms):.1f} ms, {queries} queries, {int(size) // 1024} KiB", f"<= {TARGET_PAGE_MS:.0f} ms"))
        _common.table(rows)
    finally:
        _common.drop_database(bench_url)


if __name__ == "__main__":
    main()
