"""A queued execution says where it stands (``GET /api/executions/{id}``'s ``queue``): its place
among its project's queued executions and what it waits for (docs/capacity.md). The admissions
stay in the test's transaction, so no worker takes them; each is given its own admission time
(in one transaction the database clock does not move)."""

from datetime import timedelta

from tests.conftest import start_turn


def test_a_queued_execution_shows_its_place_and_what_it_waits_for(db, team, scripted_session, api_as):
    from collab.models import Job

    api, first_sid = scripted_session(team.member, [{"text": "x"}])
    r = api.post("/api/projects/alpha/sessions", {"title": "second", "agent_id": "bot"})
    second_sid = r.json()["id"]
    first = start_turn(api, first_sid, "one").json()["execution_id"]
    second = start_turn(api, second_sid, "two").json()["execution_id"]
    behind = start_turn(api, first_sid, "three").json()["execution_id"]  # same agent, queued behind "one"
    spread_admissions(first, second, behind)

    # no worker here: all three stay queued, first come first served within the project
    assert api.get(f"/api/executions/{first}").json()["queue"] == {"position": 1, "waiting_for": "slot"}
    assert api.get(f"/api/executions/{second}").json()["queue"] == {"position": 2, "waiting_for": "slot"}
    assert api.get(f"/api/executions/{behind}").json()["queue"] == {"position": 3, "waiting_for": "branch"}

    # a claim declined for the project's running cap marks the job: it waits for the cap
    Job.objects.filter(pk=second).update(waiting_since=Job.objects.get(pk=second).created_at)
    assert api.get(f"/api/executions/{second}").json()["queue"] == {"position": 2, "waiting_for": "project_cap"}


def test_another_projects_queue_does_not_move_a_place_and_a_started_execution_has_none(db, team, scripted_session,
                                                                                      api_as, run_queued):
    from collab.models import Job

    api, sid = scripted_session(team.member, [{"text": "x"}])
    outsider, other_sid = scripted_session(team.outsider, [{"text": "y"}], project="beta")
    for n in range(3):  # another project's queue, older than ours
        r = outsider.post("/api/projects/beta/sessions", {"title": f"b{n}", "agent_id": "bot"})
        start_turn(outsider, r.json()["id"], "theirs")
    mine = start_turn(api, sid, "mine").json()["execution_id"]
    spread_admissions(*Job.objects.order_by("created_at", "pk").values_list("pk", flat=True).exclude(pk=mine), mine)
    assert api.get(f"/api/executions/{mine}").json()["queue"] == {"position": 1, "waiting_for": "slot"}
    run_queued()
    done = api.get(f"/api/executions/{mine}").json()
    assert done["status"] == "succeeded" and done["queue"] is None


def spread_admissions(*job_ids) -> None:
    """The jobs admitted one second apart, in this order."""
    from collab.models import Job

    start = Job.objects.get(pk=job_ids[0]).created_at
    for n, job_id in enumerate(job_ids):
        Job.objects.filter(pk=job_id).update(created_at=start + timedelta(seconds=n))
