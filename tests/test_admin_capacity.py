"""The admin's executions page shows the turn slots in use per worker process and the queue
(docs/capacity.md, "Seeing it")."""

from django.db.models.functions import Now
from django.urls import reverse

from tests.test_admin import operator  # noqa: F401 - the fixture


def test_the_executions_page_shows_slots_in_use_per_worker_and_the_queue(db, operator, team, settings):  # noqa: F811
    settings.TRELLIS_TURNS_PER_WORKER = 64
    from collab.models import AgentSpec, Job
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "x"}])
    sessions = [do_create_session(team.member, team.alpha, title=f"s{n}", agent_id="echo") for n in range(4)]
    jobs = [do_start_user_turn(team.member, s, "go") for s in sessions]
    # three turns in slots of two worker processes (as a claim leaves them), one still queued
    for job, worker in zip(jobs[:3], ["host-a:101", "host-a:101", "host-b:202"]):
        Job.objects.filter(pk=job.pk).update(status="running", worker=worker, started_at=Now(), heartbeat_at=Now(),
                                             lease_expires_at=Now())
    page = operator.get(reverse("admin:collab_job_changelist")).content.decode()
    capacity = page[page.index('id="capacity"'):page.index("</section>", page.index('id="capacity"'))]
    assert "3 turns in worker slots, 1 queued" in capacity
    assert "<td>host-a:101</td><td>2 / 64</td><td>62</td>" in capacity
    assert "<td>host-b:202</td><td>1 / 64</td><td>63</td>" in capacity
    assert "up to 64 turns at once" in capacity


def test_a_foreground_child_in_its_callers_slot_takes_no_slot_of_its_own(db, operator, team):  # noqa: F811
    from collab.models import AgentSpec, Job
    from collab.selectors.capacity import capacity
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "x"}])
    session = do_create_session(team.member, team.alpha, title="s", agent_id="echo")
    job = do_start_user_turn(team.member, session, "go")
    Job.objects.filter(pk=job.pk).update(status="running", worker="h:1", run_in_background=False, started_at=Now(),
                                         heartbeat_at=Now(), lease_expires_at=Now())
    seen = capacity()
    assert (seen.running, seen.workers, seen.queued) == (0, [], 0)
