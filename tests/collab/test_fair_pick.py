"""A contended worker slot goes to the project furthest behind (docs/capacity.md, "Fair share").

A worker task names a job, but the broker hands tasks out first in, first out: behind one
project's backlog, another project's turn would wait for the whole backlog. When a slot comes free
after its task had to wait for it, the task claims the fairest queued job instead
(``collab.services.fair_share.fairest_queued_job``): the oldest of the project with the fewest
jobs in worker slots. Its own job is then handed to the broker again, and the task of the job it
claimed finds that job gone and does nothing: every task claims at most one job, and every
queued job keeps a task on the way.

- the pick itself, on rows admitted through the API and claimed as a worker claims them;
- end to end on one worker process of two slots: project beta's one turn, admitted while two of
  project alpha's eight fill both slots, starts at the first slot to come free — not after
  alpha's backlog — and every turn of both projects succeeds, alpha's oldest first.
"""

import pytest

from collab import brokers
from collab.models import Job, JobStatus
from collab.services.execution import claim_for_slot, claim_job
from collab.services.fair_share import fairest_queued_job
from tests.collab.test_turns_side_by_side import one_worker, queue_name  # noqa: F401
from tests.conftest import make_spec, open_session, poll, turn


def admit(api, project, agent_id, count, *, title="t"):
    """``count`` turns, each in a session of its own: their execution ids, oldest first."""
    return [turn(api, open_session(api, agent_id, title=f"{title} {n}", project=project), f"{title} {n}")
            for n in range(count)]


@pytest.fixture
def two_projects(team, api_as):
    alpha, beta = api_as(team.member), api_as(team.outsider)
    make_spec(api_as(team.owner), "long", [{"sleep_ms": 1200}, {"text": "alpha done: {{prompt}}"}])
    make_spec(beta, "quick", [{"text": "beta done: {{prompt}}"}], project="beta")
    return alpha, beta


def pick():
    found = fairest_queued_job()
    return found and found[0]


def test_a_project_alone_gets_its_oldest_queued_turn(two_projects):
    alpha, _ = two_projects
    ids = admit(alpha, "alpha", "long", 3)
    assert pick() == ids[0]
    assert claim_job(ids[0]) is not None
    assert pick() == ids[1]  # the running one left the queue
    alpha_project = Job.objects.get(pk=ids[0]).project_id
    assert fairest_queued_job(ruled_out={alpha_project}) is None


def test_the_pick_goes_to_the_project_with_fewer_jobs_in_worker_slots(two_projects):
    alpha, beta = two_projects
    alpha_ids = admit(alpha, "alpha", "long", 4)
    beta_ids = admit(beta, "beta", "quick", 2)
    assert pick() == alpha_ids[0]  # none running anywhere: the oldest queued turn
    claim_job(alpha_ids[0])
    assert pick() == beta_ids[0]  # alpha 1 in slots, beta 0
    claim_job(beta_ids[0])
    assert pick() == alpha_ids[1]  # 1 and 1: the project whose oldest waits longest
    claim_job(alpha_ids[1])
    assert pick() == beta_ids[1]


def test_the_pick_skips_turns_that_must_wait_for_their_branch_or_their_projects_cap(two_projects):
    alpha, beta = two_projects
    sid = open_session(alpha, "long", project="alpha")
    first = turn(alpha, sid, "first")
    behind = turn(alpha, sid, "behind")  # queued behind the first on the same branch
    claim_job(first)
    beta_ids = admit(beta, "beta", "quick", 1)
    Job.objects.filter(pk=beta_ids[0]).update(waiting_since=Job.objects.get(pk=first).created_at)  # declined for beta's cap
    assert pick() is None, "the one behind a running turn and the one waiting for its cap"
    Job.objects.filter(pk=beta_ids[0]).update(waiting_since=None)
    assert pick() == beta_ids[0]
    assert Job.objects.get(pk=behind).status == JobStatus.QUEUED


def test_a_task_whose_slot_went_to_a_fairer_turn_hands_its_own_out_again(two_projects, django_capture_on_commit_callbacks,
                                                                        monkeypatch):
    """alpha's second task, contended, claims beta's turn (beta has none in slots) and hands
    alpha's second turn to the broker again; beta's own task then finds its turn running and
    claims nothing; the new task of alpha's second turn claims it."""
    alpha, beta = two_projects
    alpha_ids = admit(alpha, "alpha", "long", 2)
    beta_id = admit(beta, "beta", "quick", 1)[0]
    assert claim_for_slot(alpha_ids[0], contended=False).pk == alpha_ids[0]
    handed_out = []
    monkeypatch.setattr(brokers, "async_task", lambda path, *args, **kwargs: handed_out.append(args))
    with django_capture_on_commit_callbacks(execute=True):
        assert claim_for_slot(alpha_ids[1], contended=True).pk == beta_id
    assert handed_out == [(alpha_ids[1],)], "alpha's second turn has a task again"
    monkeypatch.undo()
    assert Job.objects.get(pk=alpha_ids[1]).heartbeat_at is not None  # the reconciler's clock: handed out now
    assert claim_for_slot(beta_id, contended=False) is None  # its turn is running already
    assert claim_for_slot(alpha_ids[1], contended=True).pk == alpha_ids[1]  # the fairest now: its own
    assert sorted(Job.objects.filter(status=JobStatus.RUNNING).values_list("pk", flat=True)) == sorted([*alpha_ids, beta_id])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_another_projects_turn_starts_at_the_next_free_slot_not_after_the_backlog(two_projects, one_worker):  # noqa: F811
    alpha, beta = two_projects
    backlog = admit(alpha, "alpha", "long", 8, title="alpha")
    one_worker(TRELLIS_TURNS_PER_WORKER="2")  # capacity 2: alpha alone may take both slots
    poll(lambda: Job.objects.filter(pk__in=backlog, status=JobStatus.RUNNING).count() == 2,
         what="alpha's first two turns in both slots")
    beta_id = admit(beta, "beta", "quick", 1, title="beta")[0]  # behind alpha's six others in the broker
    assert beta.wait(beta_id, timeout=120)["status"] == "succeeded"
    for eid in backlog:
        done = alpha.wait(eid, timeout=120)
        assert done["status"] == "succeeded", done
        assert done["result"].startswith("alpha done"), done

    jobs = {job.pk: job for job in Job.objects.filter(pk__in=[*backlog, beta_id])}
    beta_job = jobs[beta_id]
    first_end = min(jobs[eid].finished_at for eid in backlog)
    started_before_beta = [eid for eid in backlog if jobs[eid].started_at < beta_job.started_at]
    print(f"beta started {(beta_job.started_at - first_end).total_seconds():.2f}s after alpha's first turn "
          f"ended; alpha turns started before it: {len(started_before_beta)} of {len(backlog)}")
    # beta's turn took one of the first slots to come free, not one after alpha's backlog: before
    # it started at most the two alpha turns that filled the slots and, when both ended at once
    # (then neither project had a turn in a slot), alpha's oldest waiting one
    assert len(started_before_beta) <= 3, started_before_beta
    # alpha's own turns still started oldest first
    order = sorted(backlog, key=lambda eid: jobs[eid].started_at)
    assert order == backlog, "alpha's turns started out of their order"
    assert all(job.worker for job in jobs.values())
