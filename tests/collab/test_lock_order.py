"""Locks without stale reads.

Every row read under a lock is read after the lock is held, in one order (session → branch →
job, collab/services/locking.py), and a transaction that can still deadlock runs again whole.
Fifty people and agents forking, posting turns, delegating and cancelling at once on one branch
is the reliability suite's R7 (tests/reliability/test_r7_concurrent_forks.py); here, the
database's own guard on a ``stopping`` job.
"""

import pytest

from tests.conftest import make_spec

pytestmark = pytest.mark.slow


@pytest.mark.django_db(transaction=True)
def test_a_stopping_job_ends_only_cancelled_and_the_database_agrees(team, api_as):
    """``stopping`` → ``succeeded``/``failed``/``interrupted`` is refused
    by the database guard (migration 0012), ``stopping`` → ``cancelled`` is accepted; and
    ``finish_job`` asked to end a stopping job as succeeded ends it cancelled, without its answer."""
    from django.db import DatabaseError, transaction
    from django.utils import timezone

    from collab.models import Artifact, Branch, Job, Message, Session
    from collab.services.execution import finish_job
    from collab.services.turns import selected_branch

    owner = api_as(team.owner)
    make_spec(owner, "quick", [{"text": "done"}])
    api = api_as(team.member)
    now = timezone.now()
    ids = []
    for n in range(2):  # rows made here, never handed to a worker: moved by hand to "stopping"
        sid = api.post("/api/projects/alpha/sessions", {"title": f"guard {n}", "agent_id": "quick"}).json()["id"]
        branch = selected_branch(Session.objects.get(pk=sid))
        job = Job.objects.create(project_id=team.alpha.pk, session_id=sid, branch=branch, kind="user",
                                 status="queued", prompt=f"p{n}", started_by=team.member)
        Job.objects.filter(pk=job.pk).update(status="running", started_at=now)
        Job.objects.filter(pk=job.pk).update(status="stopping", cancel_requested_at=now)
        ids.append(job.pk)
    assert Branch.objects.filter(jobs__pk__in=ids).count() == 2

    for illegal in ("succeeded", "failed", "interrupted"):
        with pytest.raises(DatabaseError), transaction.atomic():
            Job.objects.filter(pk=ids[0]).update(status=illegal, finished_at=now)
    assert Job.objects.get(pk=ids[0]).status == "stopping"

    # an answer long enough to need an artifact: not kept, and neither is its full text
    late = "a late answer " * 3000
    ended = finish_job(Job.objects.get(pk=ids[0]), status="succeeded", final_text=late, result_text=late)
    assert (ended.status, ended.error_code, ended.is_error) == ("cancelled", "cancelled", True)
    assert (ended.result_text, ended.result_artifact_id) == ("cancelled", None)
    assert not Message.objects.filter(job_id=ids[0], text=late).exists()
    assert not Artifact.objects.filter(job_id=ids[0]).exists()
    Job.objects.filter(pk=ids[1]).update(status="cancelled", finished_at=now)
    assert Job.objects.get(pk=ids[1]).status == "cancelled"
