"""The HTMX pages as a person uses them, through the real URL stack (docs/web-app.md)."""

import re

import pytest

from collab.models import Branch, Job, NameStage


def _session_with_a_turn(api, sid):
    from collab.runtime.loop import run_job

    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": "first question"}).json()["execution_id"]
    run_job(job)  # run it here, exactly as a worker would
    return job


def test_a_person_forks_from_any_visible_node_and_the_fork_gets_a_label(team, scripted_session, browser_of):
    """A person can fork from any visible node from the page: the fork is a
    new branch at that exact node, named by a stage-1 label from its prompt, and it runs."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _session_with_a_turn(api, sid)
    main = Branch.objects.get(session_id=sid, name="main")
    first_node = main.tip.predecessor  # the prompt node of the first turn
    page = browser_of(team.member)
    r = page.post(f"/s/{sid}/m/{first_node.pk}/fork", {"prompt": "Try the other approach instead please"})
    assert r.status_code == 302
    fork = Branch.objects.exclude(pk=main.pk).get(session_id=sid)
    assert r["Location"].endswith(f"?branch={fork.pk}")
    assert fork.forked_from_id == first_node.pk
    assert fork.name_stage == NameStage.LABEL and len(fork.name) <= 24 and fork.name.startswith("Try the other")
    job = Job.objects.get(branch=fork)
    assert job.kind == "user" and job.prompt_msg.predecessor_id == first_node.pk
    shown = page.get(f"/s/{sid}/?branch={fork.pk}").content.decode()
    assert "Try the other approach instead please" in shown and "first question" in shown
    # each message has a compact fork action for members; a viewer sees the session but has no
    # fork form and cannot fork
    assert shown.count('<details class="fork">') == Job.objects.get(branch=fork).prompt_msg.depth + 1
    viewer = browser_of(team.viewer)
    assert '<details class="fork">' not in viewer.get(f"/s/{sid}/").content.decode()
    assert viewer.post(f"/s/{sid}/m/{first_node.pk}/fork", {"prompt": "x"}).status_code == 403


def test_the_jobs_panel_tells_cancel_requested_from_stopped_and_has_a_cancel_button(team, scripted_session, browser_of):
    """The page shows "cancel requested" (stopping) and "stopped" (cancelled) as different
    states, and each open job has a cancel button that issues the execution.cancel command."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    queued = api.post(f"/api/sessions/{sid}/turns", {"prompt": "wait"}).json()["execution_id"]
    page = browser_of(team.member)
    jobs = page.get(f"/s/{sid}/jobs").content.decode()
    assert f'/s/{sid}/jobs/{queued}/cancel' in jobs and "queued" in jobs
    r = page.post(f"/s/{sid}/jobs/{queued}/cancel", {"version": "1"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert Job.objects.get(pk=queued).status == "cancelled"
    assert "stopped" in r.content.decode() and f'/jobs/{queued}/cancel' not in r.content.decode()

    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():  # the database keeps a terminal job terminal
        Job.objects.filter(pk=queued).update(status="queued")


def test_the_jobs_panel_shows_cancel_requested_for_a_stopping_job(team, scripted_session, browser_of):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    from collab.services.execution import claim_job

    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": "long"}).json()["execution_id"]
    running = claim_job(job)
    assert running is not None
    r = api.post(f"/api/executions/{job}/commands",
                 {"command_id": "c1", "action": "execution.cancel", "expected_version": running.version, "payload": {}})
    assert r.json()["status"] == "stopping"
    html = browser_of(team.member).get(f"/s/{sid}/jobs").content.decode()
    assert re.search(rf'data-job="{job}"><span class="badge">cancel requested</span>', html), html


def test_the_limits_form_validates_and_saves_for_owners(team, browser_of):
    """Limits management: the project page's form; a negative value is refused with the reason."""
    owner = browser_of(team.owner)
    r = owner.post("/p/alpha/limits", {"max_messages": "-2", "max_spawn_depth": "2"})
    assert r.status_code == 400 and "max_messages: must be &gt;= 0" in r.content.decode()
    team.alpha.refresh_from_db()
    assert team.alpha.max_spawn_depth == 1  # nothing half-written
    r = owner.post("/p/alpha/limits", {"max_messages": "3", "max_live_per_session": ""})
    assert r.status_code == 302
    team.alpha.refresh_from_db()
    assert team.alpha.max_messages == 3 and team.alpha.max_live_per_session is None
    assert "Audit log" in owner.get("/p/alpha/").content.decode()
