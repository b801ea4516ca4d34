"""Fair share (issue 11 item 6, P-SEC-6): the operator's ceilings bound every project's limits,
and a per-project cap on running jobs keeps one project's queue from starving the others."""

import io
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from accounts.models import Project
from collab.models import Job
from tests.conftest import poll


def with_ceilings(settings, **ceilings):
    settings.TRELLIS_LIMIT_CEILINGS = {**settings.TRELLIS_LIMIT_CEILINGS, **ceilings}


def spec(owner, project, agent_id, script):
    r = owner.post(f"/api/projects/{project}/agent-specs", {"agent_id": agent_id, "provider": "scripted", "script": script})
    assert r.status_code == 201, r.content


def turn(api, sid, prompt="go"):
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return r.json()["execution_id"]


def session(api, project, agent_id):
    r = api.post(f"/api/projects/{project}/sessions", {"title": "fair", "agent_id": agent_id})
    assert r.status_code == 201, r.content
    return r.json()["id"]


def test_p_sec_6_a_limit_above_the_operators_ceiling_is_refused_naming_it(team, api_as, settings):
    """P-SEC-6: above a ceiling, or 0 ("unlimited") under a finite one, is a 400 ``invalid_limit``
    naming the ceiling's variable; nothing changes. Null inherits the ceiling."""
    with_ceilings(settings, max_messages=4, max_live_per_session=2, max_cost_per_job=Decimal("1.5"), max_running_jobs=2)
    owner = api_as(team.owner)
    before = owner.get("/api/projects/alpha/limits").json()
    assert before["ceilings"]["max_messages"] == 4 and before["ceilings"]["max_cost_per_job"] == "1.5"
    assert before["max_messages"] == 8 and before["effective"]["max_messages"] == 4  # the default row, capped

    for field, value, variable in (("max_messages", 5, "TRELLIS_MAX_MESSAGES"), ("max_messages", 0, "TRELLIS_MAX_MESSAGES"),
                                   ("max_live_per_session", 3, "TRELLIS_MAX_LIVE_PER_SESSION"),
                                   ("max_cost_per_job", "2", "TRELLIS_MAX_COST_PER_JOB"),
                                   ("max_running_jobs", 3, "TRELLIS_MAX_RUNNING_PER_PROJECT")):
        r = owner.patch("/api/projects/alpha/limits", {field: value})
        assert r.status_code == 400, (field, value, r.content)
        body = r.json()
        assert body["code"] == "invalid_limit" and body["field"] == field and variable in body["detail"], body
        assert "ceiling" in body
    assert owner.get("/api/projects/alpha/limits").json() == before

    r = owner.patch("/api/projects/alpha/limits", {"max_messages": 3, "max_live_per_session": None, "max_running_jobs": 1})
    assert r.status_code == 200, r.content
    limits = r.json()
    assert limits["effective"]["max_messages"] == 3
    assert limits["max_live_per_session"] is None and limits["effective"]["max_live_per_session"] == 2
    assert limits["effective"]["max_running_jobs"] == 1

    # the operator's command obeys the same ceilings
    with pytest.raises(CommandError, match="TRELLIS_MAX_MESSAGES"):
        call_command("limits", "alpha", "max_messages=0", stdout=io.StringIO())


def test_p_sec_6_a_row_set_before_the_ceiling_was_lowered_is_capped_at_admission(team, api_as, settings, scripted_session):
    """P-SEC-6: the value in force is min(project, ceiling), whatever the row says."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    Project.objects.filter(slug="alpha").update(max_jobs_per_session=50)  # allowed when it was set
    with_ceilings(settings, max_jobs_per_session=2)
    assert api.get("/api/projects/alpha/limits").json()["effective"]["max_jobs_per_session"] == 2
    turn(api, sid, "one")
    turn(api, sid, "two")
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "three"})
    assert r.status_code == 429 and r.json()["code"] == "quota.jobs_exhausted", r.content
    assert Job.objects.filter(session_id=sid).count() == 2


@pytest.mark.slow
def test_p_sec_6_a_sleep_ms_step_ends_at_the_runtime_ceiling(team, api_as, settings, worker):
    """P-SEC-6: a scripted ``sleep_ms`` of ten minutes, in a project with no runtime limit of its
    own, ends at the operator's runtime ceiling (here run inline by a gateway ``agent`` call in
    this process, whose settings carry the ceiling)."""
    owner = api_as(team.owner)
    assert owner.patch("/api/projects/alpha/limits", {"max_runtime_seconds": None}).status_code == 200
    spec(owner, "alpha", "bot", [{"text": "ready"}])
    spec(owner, "alpha", "sleeper", [{"sleep_ms": 600_000}, {"text": "never"}])
    api = api_as(team.member)
    sid = session(api, "alpha", "bot")
    assert api.wait(turn(api, sid))["status"] == "succeeded"
    address = api.get(f"/api/sessions/{sid}/branches").json()[0]["address"]

    with_ceilings(settings, max_runtime_seconds=1)
    r = api.post(f"/api/branches/{address}/tools/agent",
                 {"arguments": {"prompt": "sleep", "agent_id": "sleeper", "description": "sleeper"}})
    assert r.status_code == 200, r.content
    child = api.get(f"/api/executions/{r.json()['details']['execution_id']}").json()
    assert child["status"] == "failed" and child["error_code"] == "quota.runtime_exceeded", child


@pytest.mark.slow
def test_p_sec_6_one_projects_queue_does_not_keep_another_projects_turn_from_starting(team, api_as, worker):
    """P-SEC-6: with a running cap of 1 in project alpha and a worker of 2 slots, alpha's three long
    turns run one at a time; beta's turns start and finish while two of alpha's wait queued (a free
    slot does not go to a capped project), and a queued alpha turn starts when the running one ends."""
    owner, outsider = api_as(team.owner), api_as(team.outsider)
    assert owner.patch("/api/projects/alpha/limits", {"max_running_jobs": 1}).status_code == 200
    spec(owner, "alpha", "long", [{"sleep_ms": 120_000}, {"text": "done"}])
    spec(outsider, "beta", "quick", [{"text": "beta answers"}])
    member = api_as(team.member)
    alpha_jobs = [turn(member, session(member, "alpha", "long"), f"long {n}") for n in range(3)]
    beta_sid = session(outsider, "beta", "quick")

    def alpha_states():
        return sorted(Job.objects.filter(pk__in=alpha_jobs).values_list("status", flat=True))

    poll(lambda: alpha_states() == ["queued", "queued", "running"], what="one alpha turn running")
    for prompt in ("first", "second"):  # each finishes while alpha's other two still wait
        done = outsider.wait(turn(outsider, beta_sid, prompt))
        assert done["status"] == "succeeded", done
        assert alpha_states() == ["queued", "queued", "running"]

    running = Job.objects.get(pk__in=alpha_jobs, status="running")
    r = member.post(f"/api/executions/{running.pk}/commands",
                    {"command_id": "stop-1", "action": "execution.cancel", "expected_version": running.version, "payload": {}})
    assert r.status_code == 202, r.content
    member.wait(running.pk)
    # the next alpha turn starts, and only one: never past the cap
    poll(lambda: alpha_states() == ["cancelled", "queued", "running"], what="the next alpha turn running")
