#!/usr/bin/env python
"""Fan-out (the "Parallel agents" target of docs/performance.md#targets):
8 background children and their 8 follow-ups, platform time against the 2 s target,
measured on this machine.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/14 \\
      .venv/bin/python bench/fanout.py [--rounds 3] [--children 8] [--workers 2]

Creates a throw-away database ``<db>_bench_fanout`` next to DATABASE_URL's and, with the ORM
broker and (when REDIS_URL is set) the Redis broker, a real ``qcluster`` of ``--workers``
workers. Each round opens a session of a scripted agent (docs/contract.md#the-scripted-provider) whose user turn's first
step calls ``agent(…, run_in_background=True)`` ``--children`` times; each child answers at once,
and each child's result comes back to the caller as a follow-up turn. The turn is submitted
through the public API (``POST /api/sessions/{sid}/turns``, bearer token, Django's test client);
the round ends when every job of the session is terminal and every child's result has been
delivered to the caller (``followup_state``) (several results may arrive in one follow-up turn: the table shows how
many follow-up turns the platform ran). The model
is scripted with zero latency, so the platform time is the wall time: from the user turn's
admission to the last job's finish (the jobs' own timestamps). Prints the median and the worst
round beside the target, with the machine's raw INSERT+COMMIT rate from the same run.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402

TARGET_S = 2.0


def script(children: int) -> dict:
    calls = [{"name": "agent", "arguments": {"prompt": f"child task {i}", "description": f"child {i}",
                                             "run_in_background": True}} for i in range(children)]
    child = [{"text": "child result for: {{prompt}}"}]
    return {"user": [{"tool_calls": calls}, {"text": "spawned"}], "task": child, "spawn": child, "message": child,
            "followup": [{"text": "noted"}]}


def phase_run(args):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.models import ApiToken, Membership, Project, TokenScope
    from collab.models import TERMINAL_STATUSES, AgentSpec, Job
    from collab.models.jobs import FollowupState
    from collab.services.sessions import do_create_session

    user, _ = get_user_model().objects.get_or_create(username="bench")
    project, _ = Project.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    Membership.objects.get_or_create(user=user, project=project, defaults={"role": "owner"})
    AgentSpec.objects.update_or_create(project=project, agent_id="fan", defaults={"script": script(args.children)})
    _, raw = ApiToken.issue(user, name="bench", scopes=TokenScope.values)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="localhost")
    results = []
    for _ in range(args.rounds + 1):  # the first round warms up the client and the workers
        session = do_create_session(user, project, title="fan-out", agent_id="fan")
        r = client.post(f"/api/sessions/{session.pk}/turns", {"prompt": "fan out"}, content_type="application/json")
        if r.status_code != 202:
            raise SystemExit(f"POST turns: {r.status_code} {r.content[:500]!r}")
        jobs = Job.objects.filter(session=session)
        delivered = jobs.filter(caller_session=session, followup_state=FollowupState.DELIVERED)
        deadline = time.monotonic() + 120
        while True:
            rows = list(jobs.values_list("kind", "status"))
            owed = jobs.filter(followup_state=FollowupState.OWED).exists()
            if all(s in TERMINAL_STATUSES for _, s in rows) and not owed and delivered.count() >= args.children:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"fan-out did not settle: {rows}, {delivered.count()} results delivered")
            time.sleep(0.01)
        times = list(jobs.values_list("created_at", "finished_at", "kind", "status"))
        first, last = min(t[0] for t in times), max(t[1] for t in times)
        kinds = {}
        for t in times:
            kinds[t[2]] = kinds.get(t[2], 0) + 1
        failed = sum(1 for t in times if t[3] != "succeeded")
        results.append(((last - first).total_seconds(), kinds, failed, delivered.count()))
    results = results[1:]
    print("seconds=" + ",".join(f"{r[0]:.4f}" for r in results))
    print("delivered=" + ",".join(str(r[3]) for r in results))
    print("kinds=" + ",".join(f"{k}:{v}" for k, v in sorted(results[-1][1].items())))
    print(f"failed={sum(r[2] for r in results)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--phase", choices=["run"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if _common.run_phase(args, {"run": phase_run}):
        return
    bench_url = _common.create_database("bench_fanout")
    try:
        raw = _common.raw_insert_rate(bench_url)
        rows = [("raw single-row INSERT+COMMIT", f"{raw:,.0f}/s", "(machine)")]
        for broker in ["orm"] + (["redis"] if os.environ.get("REDIS_URL") else []):
            env = _common.bench_env(bench_url, broker, args.workers, tag="bench-fanout")
            with _common.worker(env):
                r = _common.child("fanout.py", "run", env, "--rounds", str(args.rounds),
                                  "--children", str(args.children))
            seconds = [float(x) for x in r["seconds"].split(",")]
            label = f"[{broker}, {args.workers} workers, {args.children} children, {args.rounds} rounds]"
            rows += [
                (f"{label} platform time, median", f"{statistics.median(seconds):.2f} s", f"<= {TARGET_S:.0f} s"),
                (f"{label} platform time, worst", f"{max(seconds):.2f} s", f"<= {TARGET_S:.0f} s"),
                (f"{label} jobs in the last round by kind", r["kinds"].replace(",", " "), ""),
                (f"{label} results delivered to the caller per round", r["delivered"].replace(",", " "),
                 f"{args.children} each"),
            ]
            if int(r["failed"]):
                rows.append((f"{label} jobs not succeeded", r["failed"], "0"))
        _common.table(rows)
    finally:
        _common.drop_database(bench_url)


if __name__ == "__main__":
    main()
