#!/usr/bin/env python
"""The CPU of one scripted turn on each side, in one process (the "≥ 100 turns/s
with two workers" target of docs/performance.md#targets and the sequential p50: where the Python
time goes).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/turn_cpu.py [--turns 300] [--profile web|worker]

Creates a throw-away database ``<db>_bench_turn_cpu`` next to DATABASE_URL's (or, without a
PostgreSQL DATABASE_URL, runs on the SQLite database the settings name) and runs ``--turns``
turns one after another on one scripted branch, each in two parts timed apart:

- web: what ``POST /api/sessions/{sid}/turns?wait=`` does with the database — the bearer token's
  lookup (``accounts.policy.token_for``), the access read (``access_session``), the admission
  (``do_start_user_turn``; the tasks it hands to the broker are dropped: nothing else runs them),
  and, once the turn has ended, the execution's read and shape (``access_job``,
  ``execution_shape``, ``redact_executions``);
- worker: ``collab.runtime.loop.run_job``, as a worker runs it.

Prints the process's CPU (``time.process_time``: every thread of it, the event push's too) per
part, and the statements of each part of one more turn (not timed), after ``--warm`` turns that
are not counted. ``--profile web|worker`` prints where that part's CPU went (cProfile,
cumulative or ``--sort``) instead of timing.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402


def phase_run(args):
    import cProfile
    import pstats

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import ApiToken, Membership, Project, TokenScope
    from accounts.policy import token_for
    from collab.access import access_job, access_session
    from collab.models import AgentSpec
    from collab.runtime.loop import run_job
    from collab.selectors.redact import redact_executions
    from collab.selectors.shapes import execution_shape
    from collab.services import admission, naming
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    admission.async_task = naming.async_task = lambda *a, **k: None  # this process runs the turns
    user, _ = get_user_model().objects.get_or_create(username="bench-cpu")
    project, _ = Project.objects.get_or_create(slug="bench-cpu", defaults={"name": "Bench CPU"})
    Membership.objects.get_or_create(user=user, project=project, defaults={"role": "owner"})
    AgentSpec.objects.get_or_create(project=project, agent_id="echo",
                                    defaults={"provider": "scripted", "script": [{"text": "ok {{prompt}}"}]})
    _, raw = ApiToken.issue(user, name="bench-cpu", scopes=TokenScope.values)
    sid = do_create_session(user, project, title="cpu", agent_id="echo").pk

    def admit(prompt):
        caller = token_for(raw).user
        return do_start_user_turn(caller, access_session(caller, sid, "turn.start"), prompt).pk

    def read(job_id):
        caller = token_for(raw).user
        return redact_executions(caller, [execution_shape(access_job(caller, job_id))])[0]

    profiles = {side: cProfile.Profile(time.process_time) for side in ("web", "worker")}  # CPU, as the timing

    def timed(side, fn, *a):
        start = time.process_time()
        if args.profile == side:
            profiles[side].enable()
        result = fn(*a)
        if args.profile == side:
            profiles[side].disable()
        return result, time.process_time() - start

    def one_turn(i):
        job_id, admitting = timed("web", admit, f"turn {i}")
        status, running = timed("worker", run_job, job_id)
        assert status == "succeeded", status
        shape, reading = timed("web", read, job_id)
        assert shape["status"] == "succeeded"
        return admitting + reading, running

    for i in range(args.warm):
        one_turn(-1 - i)
    if args.profile:
        for side in profiles:
            profiles[side] = cProfile.Profile(time.process_time)
        for i in range(args.turns):
            one_turn(i)
        pstats.Stats(profiles[args.profile]).sort_stats(args.sort).print_stats(45)
        return
    used = [one_turn(i) for i in range(args.turns)]
    control = ("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK")

    def statements(fn, *a):
        with CaptureQueriesContext(connection) as queries:
            result = fn(*a)
        return result, sum(1 for q in queries.captured_queries
                           if q["sql"].lstrip().split(None, 1)[0].upper() not in control)

    job_id, web_statements = statements(admit, "counted")  # one more turn, not timed
    _, worker_statements = statements(run_job, job_id)
    _, read_statements = statements(read, job_id)
    print(f"vendor={connection.vendor}")
    print(f"turns={args.turns}")
    for n, side in enumerate(("web", "worker")):
        cpu = sorted(u[n] for u in used)
        print(f"{side}_cpu_ms_mean={1000 * sum(cpu) / len(cpu):.2f}")
        print(f"{side}_cpu_ms_p50={1000 * cpu[len(cpu) // 2]:.2f}")
    print(f"web_statements={web_statements}+{read_statements}")
    print(f"worker_statements={worker_statements}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--profile", choices=("web", "worker"))
    parser.add_argument("--sort", default="cumulative", help="with --profile: pstats' sort key (tottime, …)")
    parser.add_argument("--phase")
    args = parser.parse_args()
    if _common.run_phase(args, {"run": phase_run}):
        return
    argv = ["--turns", str(args.turns), "--warm", str(args.warm), *(["--profile", args.profile, "--sort", args.sort] if args.profile else [])]
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        os.execv(sys.executable, [sys.executable, __file__, "--phase", "run", *argv])
    bench_url = _common.create_database("bench_turn_cpu")
    try:
        env = _common.bench_env(bench_url, "redis" if os.environ.get("REDIS_URL") else "orm", tag="bench-cpu")
        import subprocess

        subprocess.run([sys.executable, "bench/turn_cpu.py", "--phase", "run", *argv], env=env,
                       cwd=_common.ROOT, check=True)
    finally:
        _common.drop_database(bench_url)


if __name__ == "__main__":
    main()
