"""Steering a session from its page, in-process through the real URL stack:
who is offered cancel, archive, hold decisions and the spec page — and who is refused when
they send the form anyway — plus bad input answered 4xx with a reason a person can read."""

import json
import re

import pytest

from accounts.models import Membership
from collab.models import AgentSpec, Branch, Event, HeldDelivery, Job, NameStage, SessionShare


@pytest.fixture
def colleague(team, make_user):
    """A second member of ``alpha``: someone else's executions and branches are not theirs."""
    user = make_user("colleague")
    Membership.objects.create(user=user, project=team.alpha, role="member")
    return user


def _main(sid) -> Branch:
    return Branch.objects.get(session_id=sid, name="main")


def _answered(api, sid, prompt="first question"):
    from collab.runtime.loop import run_job

    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]
    run_job(job)  # run here, exactly as a worker would
    return job


def _cancel_forms(html: str) -> set[str]:
    return set(re.findall(r"/jobs/([^/\"]+)/cancel", html))


# --- the composer ---------------------------------------------------------------------------------


def test_the_composer_names_the_branch_and_agent_it_posts_to(team, scripted_session, browser_of):
    api, sid = scripted_session(team.member, [{"text": "answer"}], agent_id="helper-bot")
    _answered(api, sid)
    html = browser_of(team.member).get(f"/s/{sid}/").content.decode()
    composer = re.search(r'<p class="composer-to small" id="composer-to">(.*?)</p>', html, re.S).group(1)
    assert re.sub(r"<[^>]+>", "", composer).split() == ["To", "helper-bot", "on", "main"]
    assert 'id="composer-box" class="composer-box"' in html and 'id="fork-from-here"' not in html


def test_on_an_archived_branch_the_composer_offers_a_named_fork_instead(team, scripted_session, browser_of):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _answered(api, sid)
    main = _main(sid)
    page = browser_of(team.member)
    stale_composer = page.get(f"/s/{sid}/").content.decode()  # a page opened before the archive
    assert page.post(f"/s/{sid}/b/{main.pk}/archive", {"reason": "went nowhere"}).status_code == 302

    html = page.get(f"/s/{sid}/?branch={main.pk}").content.decode()
    assert 'id="composer"' not in html and 'id="fork-from-here"' in html
    assert "is archived" in html and "went nowhere" in html
    assert f'/s/{sid}/m/{main.tip_id}/fork' in html

    # the old form still posts: a sentence for a person, not an error code
    address = re.search(r'name="branch" value="([^"]+)"', stale_composer).group(1)
    r = page.post(f"/s/{sid}/turns", {"prompt": "more please", "branch": address}, HTTP_HX_REQUEST="true")
    assert r.status_code == 400
    body = r.content.decode()
    assert body.startswith("This branch is archived") and "fork from here" in body
    assert "start_from" not in body and not body.startswith("archived:")  # not the API's words

    r = page.post(f"/s/{sid}/m/{main.tip_id}/fork", {"prompt": "continue from the end", "name": "second try"})
    fork = Branch.objects.get(session_id=sid, name="second try")
    assert r.status_code == 302 and r["Location"].endswith(f"?branch={fork.pk}")
    assert fork.name_stage == NameStage.MANUAL and fork.forked_from_id == main.tip_id
    assert Job.objects.get(branch=fork).prompt_text == "continue from the end"


def test_fork_from_any_node_keeps_the_given_name_and_refuses_a_too_long_one(team, scripted_session, browser_of):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _answered(api, sid)
    first_node = _main(sid).tip.predecessor
    page = browser_of(team.member)
    r = page.post(f"/s/{sid}/m/{first_node.pk}/fork", {"prompt": "other way", "name": "x" * 101})
    assert r.status_code == 400 and "at most 100 characters" in r.content.decode()
    assert Branch.objects.filter(session_id=sid).count() == 1
    assert page.post(f"/s/{sid}/m/{first_node.pk}/fork", {"prompt": "other way", "name": " plan B "}).status_code == 302
    assert Branch.objects.get(session_id=sid, forked_from=first_node).name == "plan B"
    # without a name the old behaviour stands: a label from the prompt
    page.post(f"/s/{sid}/m/{first_node.pk}/fork", {"prompt": "yet another way"})
    assert Branch.objects.filter(session_id=sid, name_stage=NameStage.LABEL, name__startswith="yet another").exists()


# --- cancel ---------------------------------------------------------------------------------------


def test_cancel_is_offered_to_members_for_their_own_turns_and_to_maintainers_for_any(
        team, scripted_session, browser_of, api_as, colleague):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    own = api.post(f"/api/sessions/{sid}/turns", {"prompt": "mine"}).json()["execution_id"]
    theirs = api_as(colleague).post(f"/api/sessions/{sid}/turns", {"prompt": "theirs"}).json()["execution_id"]

    assert _cancel_forms(browser_of(team.member).get(f"/s/{sid}/jobs").content.decode()) == {own}
    assert _cancel_forms(browser_of(colleague).get(f"/s/{sid}/jobs").content.decode()) == {theirs}
    assert _cancel_forms(browser_of(team.maintainer).get(f"/s/{sid}/jobs").content.decode()) == {own, theirs}
    assert _cancel_forms(browser_of(team.viewer).get(f"/s/{sid}/jobs").content.decode()) == set()

    # the form sent anyway is refused, and the job runs on
    assert browser_of(team.member).post(f"/s/{sid}/jobs/{theirs}/cancel", {"version": "1"}).status_code == 403
    assert browser_of(team.viewer).post(f"/s/{sid}/jobs/{own}/cancel", {"version": "1"}).status_code == 403
    assert Job.objects.get(pk=theirs).status == "queued" and Job.objects.get(pk=own).status == "queued"
    assert browser_of(team.maintainer).post(f"/s/{sid}/jobs/{theirs}/cancel", {"version": "1"}).status_code == 302
    assert Job.objects.get(pk=theirs).status == "cancelled"
    r = browser_of(team.member).post(f"/s/{sid}/jobs/{own}/cancel", {"version": "x"})
    assert r.status_code == 400 and "whole number" in r.content.decode()


def test_a_running_turn_has_its_cancel_button_next_to_it_in_the_transcript(team, scripted_session, browser_of):
    from collab.services.execution import claim_job

    api, sid = scripted_session(team.member, [{"text": "answer"}])
    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": "long"}).json()["execution_id"]
    assert claim_job(job) is not None  # running now
    mine = browser_of(team.member).get(f"/s/{sid}/transcript").content.decode()
    assert re.search(rf'<p class="working"[^>]*>.*?<form class="inline cancel-running" [^>]*/jobs/{job}/cancel', mine, re.S)
    assert "cancel-running" not in browser_of(team.viewer).get(f"/s/{sid}/transcript").content.decode()
    r = browser_of(team.member).post(f"/s/{sid}/jobs/{job}/cancel", {"version": str(Job.objects.get(pk=job).version),
                                                                       "shown_branch": _main(sid).pk})
    assert r.status_code == 302 and r["Location"].endswith(f"?branch={_main(sid).pk}")
    assert Job.objects.get(pk=job).status == "stopping"


# --- archive --------------------------------------------------------------------------------------


def test_archive_with_a_reason_is_for_the_branch_starter_and_maintainers(
        team, scripted_session, browser_of, colleague):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _answered(api, sid)
    main = _main(sid)
    url = f"/s/{sid}/b/{main.pk}/archive"
    assert url in browser_of(team.member).get(f"/s/{sid}/").content.decode()
    assert url in browser_of(team.maintainer).get(f"/s/{sid}/").content.decode()
    for other in (colleague, team.viewer):
        assert url not in browser_of(other).get(f"/s/{sid}/").content.decode()
        assert browser_of(other).post(url, {"reason": "mine now"}).status_code == 403
    assert browser_of(team.outsider).post(url, {"reason": "x"}).status_code == 404
    main.refresh_from_db()
    assert not main.archived

    assert browser_of(team.maintainer).post(url, {"reason": "superseded by plan B"}).status_code == 302
    main.refresh_from_db()
    assert main.archived and main.archive_reason == "superseded by plan B" and main.archived_by == team.maintainer
    event = Event.objects.get(session_id=sid, type="branch.archived")
    assert event.actor == team.maintainer and event.payload["reason"] == "superseded by plan B"
    # a branch id of another session is not this session's
    _, other_sid = scripted_session(team.member, [{"text": "answer"}], agent_id="bot2")
    assert browser_of(team.member).post(f"/s/{other_sid}/b/{main.pk}/archive", {"reason": "x"}).status_code == 404


# --- held deliveries ------------------------------------------------------------------------------


def _held(sid, member) -> HeldDelivery:
    main = _main(sid)
    return HeldDelivery.objects.create(project_id=main.session.project_id, kind="message", text="ping", target_branch=main,
                                       sender_session_id=sid, sender_branch=main, created_by=member)


def test_held_deliveries_are_decided_only_by_those_the_hold_rule_allows(team, scripted_session, browser_of, colleague):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _answered(api, sid)
    hold = _held(sid, team.member)
    decide = f"/s/{sid}/holds/{hold.pk}"
    assert f'action="{decide}"' in browser_of(team.member).get(f"/s/{sid}/activity").content.decode()
    viewer_html = browser_of(team.viewer).get(f"/s/{sid}/activity").content.decode()
    assert "ping" in viewer_html and f'action="{decide}"' not in viewer_html
    assert browser_of(team.viewer).post(decide, {"decision": "approve"}).status_code == 403

    # a member to whom a shared session is shown only for reading: no buttons, refused
    from collab.models import Session

    Session.objects.filter(pk=sid).update(visibility="shared")
    SessionShare.objects.create(session_id=sid, user=colleague, role="viewer")
    assert "ping" in browser_of(colleague).get(f"/s/{sid}/activity").content.decode()
    assert f'action="{decide}"' not in browser_of(colleague).get(f"/s/{sid}/activity").content.decode()
    assert browser_of(colleague).post(decide, {"decision": "reject"}).status_code == 403

    assert browser_of(team.member).post(decide, {"decision": "maybe"}).status_code == 400
    hold.refresh_from_db()
    assert hold.status == "pending"
    assert browser_of(team.member).post(decide, {"decision": "reject"}).status_code == 302
    hold.refresh_from_db()
    assert hold.status == "rejected" and hold.decided_by == team.member


# --- agent specs ----------------------------------------------------------------------------------


def test_the_spec_page_is_for_those_who_may_save_specs(team, browser_of):
    for user in (team.owner, team.maintainer):
        assert browser_of(user).get("/p/alpha/specs").status_code == 200
        assert 'id="specs-link"' in browser_of(user).get("/p/alpha/").content.decode()
    for user in (team.member, team.viewer):
        assert browser_of(user).get("/p/alpha/specs").status_code == 403
        assert browser_of(user).post("/p/alpha/specs", {"agent_id": "sneaky"}).status_code == 403
        assert 'id="specs-link"' not in browser_of(user).get("/p/alpha/").content.decode()
    assert browser_of(team.outsider).get("/p/alpha/specs").status_code == 404
    assert not AgentSpec.objects.filter(agent_id="sneaky").exists()


def test_a_spec_created_and_changed_from_the_page_is_validated_and_audited(team, browser_of):
    page = browser_of(team.maintainer)
    script = json.dumps([{"text": "hi: {{prompt}}"}])
    r = page.post("/p/alpha/specs", {"agent_id": "writer", "connection": "", "system_prompt": "Be brief.",
                                     "toolset": "collab", "role": "general", "followup_mode": "turn", "tools": "",
                                     "script": script, "limits": ""})
    assert r.status_code == 302 and r["Location"] == "/p/alpha/specs/writer"
    spec = AgentSpec.objects.get(project=team.alpha, agent_id="writer")
    assert spec.provider == "scripted" and spec.script == [{"text": "hi: {{prompt}}"}] and spec.system_prompt == "Be brief."
    created = Event.objects.get(project=team.alpha, type="agent_spec.created")
    assert created.actor == team.maintainer and created.payload == {"agent_id": "writer"}

    r = page.post("/p/alpha/specs/writer", {"connection": "", "system_prompt": "Be thorough.", "toolset": "collab",
                                            "role": "general", "followup_mode": "turn", "tools": "agent, send_message",
                                            "script": script, "limits": ""})
    assert r.status_code == 302
    spec.refresh_from_db()
    assert spec.system_prompt == "Be thorough." and spec.tools == ["agent", "send_message"]
    changed = Event.objects.get(project=team.alpha, type="agent_spec.changed")
    assert changed.actor == team.maintainer and changed.payload["fields"] == ["system_prompt", "tools"]
    assert "Be thorough." in page.get("/p/alpha/specs/writer").content.decode()
    # a spec of the page is one the project page offers for a new session
    assert '<option value="writer">' in browser_of(team.member).get("/p/alpha/").content.decode()


@pytest.mark.parametrize("fields, reason", [
    ({"agent_id": "bad id!"}, "agent_id must be"),
    ({"agent_id": "ok", "script": "[{not json"}, "script is not valid JSON"),
    ({"agent_id": "ok", "limits": "[1, 2]"}, "limits must be a JSON object"),
    ({"agent_id": "ok", "toolset": "everything"}, "toolset must be one of"),
    ({"agent_id": "ok", "script": json.dumps([{"bogus": 1}])}, ""),
    ({"agent_id": "ok", "connection": "nowhere", "model": "m"}, "no model connection named"),
    ({"agent_id": "ok", "model": "m" * 201}, "longer than 200"),
])
def test_bad_spec_input_is_shown_inline_with_a_400(team, browser_of, fields, reason):
    r = browser_of(team.owner).post("/p/alpha/specs", fields)
    assert r.status_code == 400
    html = r.content.decode()
    error = re.search(r'<p class="error" id="spec-error" role="alert">(.*?)</p>', html, re.S)
    assert error and reason in error.group(1), html
    assert 'id="spec-form"' in html and not AgentSpec.objects.filter(project=team.alpha).exists()


def test_a_taken_agent_id_and_a_bad_edit_are_refused_with_the_reason(team, scripted_session, browser_of):
    scripted_session(team.member, [{"text": "answer"}], agent_id="bot")
    page = browser_of(team.owner)
    r = page.post("/p/alpha/specs", {"agent_id": "bot"})
    assert r.status_code == 409 and "already exists" in r.content.decode()
    r = page.post("/p/alpha/specs/bot", {"script": "{", "toolset": "collab"})
    assert r.status_code == 400 and "script is not valid JSON" in r.content.decode()
    assert 'value="bot" disabled' in r.content.decode()
    assert page.get("/p/alpha/specs/nobody").status_code == 404
    assert not Event.objects.filter(project=team.alpha, type="agent_spec.changed").exists()


def test_connections_offered_are_the_operators_ones_this_project_may_use(team, browser_of):
    from collab.services.connections import do_register_connection

    do_register_connection("team-llm", provider="openai", base_url="http://127.0.0.1:9/v1", project=team.alpha,
                           allowed_models=["small-1"])
    do_register_connection("other-llm", provider="openai", base_url="http://127.0.0.1:9/v1", project=team.beta)
    page = browser_of(team.owner)
    html = page.get("/p/alpha/specs").content.decode()
    assert '<option value="team-llm">' in html and "other-llm" not in html and "127.0.0.1" not in html

    r = page.post("/p/alpha/specs", {"agent_id": "remote", "connection": "other-llm", "model": "small-1"})
    assert r.status_code == 400 and "no model connection named" in r.content.decode()
    r = page.post("/p/alpha/specs", {"agent_id": "remote", "connection": "team-llm", "model": "big-2"})
    assert r.status_code == 400 and "is not allowed on connection" in r.content.decode()
    assert page.post("/p/alpha/specs", {"agent_id": "remote", "connection": "team-llm", "model": "small-1"}).status_code == 302
    spec = AgentSpec.objects.get(agent_id="remote")
    assert spec.provider == "openai" and spec.connection.name == "team-llm" and spec.model == "small-1"
    # back to the scripted provider by choosing no connection
    assert page.post("/p/alpha/specs/remote", {"connection": "", "model": "", "toolset": "collab"}).status_code == 302
    spec.refresh_from_db()
    assert spec.provider == "scripted" and spec.connection is None


@pytest.mark.parametrize("fields, field, reason", [
    ({"agent_id": "ok", "script": json.dumps([{"bogus": 1}])}, "script", "invalid script"),
    ({"agent_id": "ok", "script": "[{not json"}, "script", "script is not valid JSON"),
    ({"agent_id": "bad id!"}, "agent_id", "agent_id must be"),
    ({"agent_id": "ok", "connection": "nowhere", "model": "m"}, "connection", "no model connection named"),
    ({"agent_id": "ok", "limits": "[1]"}, "limits", "limits must be a JSON object"),
])
def test_a_spec_refusal_is_shown_beside_its_field_and_what_was_typed_stays(team, browser_of, fields, field, reason):
    """The spec form (a Django form over the spec service) puts each refusal beside the field it
    is about — the service's own (a script's shape, the id, the connection) and the form's (JSON
    that does not parse) — and writes back what was typed."""
    html = browser_of(team.owner).post("/p/alpha/specs", {**fields, "system_prompt": "Keep me."}).content.decode()
    beside = re.search(rf'<span class="error small field-error" data-field="{field}">(.*?)</span>', html, re.S)
    assert beside and reason in beside.group(1), html
    assert len(re.findall(r'class="error small field-error"', html)) == 1
    assert "Keep me." in html


@pytest.mark.parametrize("script", ["[" * 5000 + "]" * 5000, '[{"text": "x", "sleep_ms": NaN}]'])
def test_a_spec_script_nested_too_deep_or_not_finite_is_a_400_not_a_500(team, browser_of, script):
    r = browser_of(team.owner).post("/p/alpha/specs", {"agent_id": "deep", "script": script})
    assert r.status_code == 400
    assert "script is not valid JSON" in r.content.decode()
    assert not AgentSpec.objects.filter(project=team.alpha, agent_id="deep").exists()
