#!/usr/bin/env python
"""Recovery time after a worker machine dies (docs/contract.md#crash-recovery).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test [REDIS_URL=redis://127.0.0.1:6379/14] \\
      .venv/bin/python bench/recovery.py [--lease 30] [--reconcile 10]

(without DATABASE_URL it uses a throw-away SQLite file and the ORM broker). Creates a
throw-away database, then:

1. worker machine A (a ``qcluster``, 2 worker processes, its own queue) runs two long turns
   R1 and R2; turn Q1 waits behind R1 on its branch and Q2 (another session) is handed to A
   too, so A's pusher has taken it;
2. a surviving machine B (2 worker processes, another queue) runs a long turn W in one slot;
3. A's whole process group is SIGKILLed at t = 0 and R2 is cancelled (``stopping``, with
   nobody left to confirm it).

Nobody runs ``manage.py reconcile``: B's worker processes recover on their own. Prints,
from t = 0, when R1 became ``interrupted``, R2 ``cancelled``, and Q1 and Q2 started on B,
against the stated bound lease + reconcile interval (docs/operations.md, "Running scaled").
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fresh_database() -> tuple[str, callable]:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        name = url.rpartition("/")[2] + "_recovery"
        admin = url.replace("postgres://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')

        def drop():
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        return f"{url.rpartition('/')[0]}/{name}", drop
    directory = tempfile.mkdtemp(prefix="trellis-recovery-")
    return f"sqlite:///{directory}/recovery.sqlite3", lambda: None


def cluster(env: dict, queue: str, log: Path) -> subprocess.Popen:
    out = open(log, "w")
    # one signing salt (TRELLIS_QUEUE_NAME) for all; Q_CLUSTER_NAME is the broker list a machine serves
    proc = subprocess.Popen([sys.executable, "manage.py", "qcluster"], env=dict(env, Q_CLUSTER_NAME=queue,
                            TRELLIS_LOG_LEVEL="INFO"),
                            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "running." not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise SystemExit(f"qcluster did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lease", type=int, default=30, help="TRELLIS_LEASE_SECONDS (default 30)")
    parser.add_argument("--reconcile", type=int, default=10, help="TRELLIS_RECONCILE_SECONDS (default 10)")
    args = parser.parse_args()

    url, drop = fresh_database()
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SECRET_KEY="bench", TRELLIS_LOG_LEVEL="WARNING",
               TRELLIS_LEASE_SECONDS=str(args.lease), TRELLIS_RECONCILE_SECONDS=str(args.reconcile),
               TRELLIS_WORKERS="2", TRELLIS_QUEUE_NAME=f"recovery-{os.getpid()}",
               TRELLIS_VAR_DIR=tempfile.mkdtemp(prefix="trellis-recovery-var-"))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django_q.conf import Conf

    from accounts.models import Membership, Project
    from collab.models import AgentSpec, Job
    from collab.services.cancel import request_cancel
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    user = get_user_model().objects.create(username="bench")
    project = Project.objects.create(slug="bench", name="Bench")
    Membership.objects.create(user=user, project=project, role="owner")
    AgentSpec.objects.create(project=project, agent_id="long", script=[{"sleep_ms": 600_000}, {"text": "never"}])
    AgentSpec.objects.create(project=project, agent_id="quick", script=[{"text": "quick"}])
    s1, s2, s4 = (do_create_session(user, project, title=t, agent_id="long") for t in ("r1", "r2", "w"))
    s3 = do_create_session(user, project, title="q2", agent_id="quick")

    tag = os.getpid()
    logs = Path(tempfile.mkdtemp(prefix="trellis-recovery-logs-"))

    def admit(queue, session, prompt, agent_id=None):
        Conf.CLUSTER_NAME = queue  # the machine this turn is handed to
        return do_start_user_turn(user, session, prompt, agent_id=agent_id).pk

    def wait_for(pk, statuses, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            job = Job.objects.get(pk=pk)
            if job.status in statuses:
                return job
            if time.monotonic() > deadline:
                raise SystemExit(f"job {pk} still {job.status} after {timeout} s")
            time.sleep(0.05)

    a = cluster(env, f"recovery-a-{tag}", logs / "a.log")
    b = cluster(env, f"recovery-b-{tag}", logs / "b.log")
    try:
        r1 = admit(f"recovery-a-{tag}", s1, "long one")
        r2 = admit(f"recovery-a-{tag}", s2, "long two")
        w = admit(f"recovery-b-{tag}", s4, "keep a slot of B busy")
        for pk in (r1, r2, w):
            wait_for(pk, {"running"})
        q1 = admit(f"recovery-a-{tag}", s1, "after the long one", agent_id="quick")
        q2 = admit(f"recovery-a-{tag}", s3, "a turn of its own")
        time.sleep(1)  # let A's pusher take Q1 and Q2 from the broker

        os.killpg(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        a.wait(15)
        with transaction.atomic():
            request_cancel(Job.objects.get(pk=r2))
        seen = {}
        wanted = {"R1 interrupted": (r1, "ended"), "R2 cancelled": (r2, "ended"),
                  "Q1 started": (q1, "started"), "Q2 started": (q2, "started")}
        deadline = killed + max(300, 6 * (args.lease + args.reconcile))
        while len(seen) < len(wanted) and time.monotonic() < deadline:
            for label, (pk, what) in wanted.items():
                if label in seen:
                    continue
                job = Job.objects.get(pk=pk)
                if (what == "ended" and job.finished_at) or (what == "started" and job.started_at):
                    seen[label] = (time.monotonic() - killed, job.status)
            time.sleep(0.05)
    finally:
        stop(a)
        stop(b)
    bound = args.lease + args.reconcile
    broker = "redis" if os.environ.get("REDIS_URL") else "orm"
    print(f"[{url.partition(':')[0]}, {broker} broker] lease {args.lease} s, reconcile every {args.reconcile} s: "
          f"stated bound {bound} s (target <= 2 x lease = {2 * args.lease} s)")
    for label in wanted:
        if label in seen:
            seconds, status = seen[label]
            print(f"  {label:16} after {seconds:6.1f} s  ({status}){'  OVER THE BOUND' if seconds > bound + 2 else ''}")
        else:
            print(f"  {label:16} not within {deadline - killed:.0f} s")
    drop()


if __name__ == "__main__":
    main()
