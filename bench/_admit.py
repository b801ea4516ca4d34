"""Helper process for bench/admission.py: `setup N` creates N sessions, `run N` admits a turn on each and waits."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402

from accounts.models import Membership, Project  # noqa: E402
from collab.access import access_session  # noqa: E402
from collab.models import AgentSpec, Job, Session  # noqa: E402
from collab.services.sessions import do_create_session  # noqa: E402
from collab.services.turns import do_start_user_turn  # noqa: E402


SEQUENTIAL = 30


def setup(n):
    user, _ = get_user_model().objects.get_or_create(username="bench")
    project, _ = Project.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    Membership.objects.get_or_create(user=user, project=project, defaults={"role": "owner"})
    AgentSpec.objects.get_or_create(project=project, agent_id="echo", defaults={"script": [{"text": "ok"}]})
    Job.objects.all().delete()
    Session.objects.all().delete()
    for i in range(n + SEQUENTIAL):
        do_create_session(user, project, title=f"s{i}", agent_id="echo")


def wait(job_ids):
    deadline = time.monotonic() + 600
    while Job.objects.filter(pk__in=job_ids).exclude(status="succeeded").exists():
        if time.monotonic() > deadline:
            raise SystemExit("turns did not finish")
        time.sleep(0.01)


def run(n):
    user = get_user_model().objects.get(username="bench")
    sessions = list(Session.objects.order_by("created_at"))
    # latency: one turn at a time on an idle worker
    latencies = []
    for s in sessions[n:n + SEQUENTIAL]:
        job = do_start_user_turn(user, s, "hello")
        wait([job.pk])
        job.refresh_from_db()
        latencies.append((job.started_at - job.created_at).total_seconds())
    sessions = sessions[:n]
    start = time.perf_counter()
    jobs = [do_start_user_turn(user, s, "hello").pk for s in sessions]
    admit_elapsed = time.perf_counter() - start
    wait(jobs)
    rows = list(Job.objects.filter(pk__in=jobs).values_list("created_at", "started_at", "finished_at"))
    first = min(r[0] for r in rows)
    last = max(r[2] for r in rows)
    print(f"sequential={SEQUENTIAL}")
    print(f"admit_per_s={n / admit_elapsed}")
    print(f"turns_per_s={n / (last - first).total_seconds()}")
    print("latencies=" + ",".join(f"{x:.4f}" for x in latencies))


def write_commits(queries) -> int:
    """Transactions that wrote: BEGIN…COMMIT blocks with a write, plus writes in autocommit."""
    count, in_block, wrote = 0, False, False
    for q in queries:
        head = q["sql"].lstrip().split(None, 1)[0].upper()
        if head in ("BEGIN", "SAVEPOINT") and not in_block:
            in_block, wrote = True, False
        elif head == "COMMIT":
            count += wrote
            in_block = False
        elif head in ("INSERT", "UPDATE", "DELETE"):
            if "django_q_" in q["sql"]:
                continue  # the ORM broker's queue row, not ours
            if in_block:
                wrote = True
            else:
                count += 1
    return count


def trace(_n):
    """One turn in this process (admission, then the worker's claim and completion), counting commits."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from collab.runtime.loop import run_job

    user = get_user_model().objects.get(username="bench")
    sid = Session.objects.order_by("-created_at").values_list("pk", flat=True).first()
    with CaptureQueriesContext(connection) as admission:  # as the API's POST …/turns, once the caller is known
        job = do_start_user_turn(user, access_session(user, sid, "turn.start"), "hello")
    with CaptureQueriesContext(connection) as turn:
        run_job(job.pk)
    print(f"admission_commits={write_commits(admission.captured_queries)}")
    print(f"worker_commits={write_commits(turn.captured_queries)}")
    print(f"queries={len(admission.captured_queries) + len(turn.captured_queries)}")
    # what the target counts (tests/collab/test_turn_queries.py): statements, without transaction
    # control (BEGIN, SAVEPOINT, RELEASE, COMMIT) and the ORM broker's queue rows
    print(f"statements={statements(admission.captured_queries) + statements(turn.captured_queries)}")


CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK")


def statements(queries) -> int:
    return sum(1 for q in queries
               if q["sql"].lstrip().split(None, 1)[0].upper() not in CONTROL and "django_q_" not in q["sql"])


if __name__ == "__main__":
    {"setup": setup, "run": run, "trace": trace}[sys.argv[1]](int(sys.argv[2]))
