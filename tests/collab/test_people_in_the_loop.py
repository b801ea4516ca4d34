"""People in the loop (docs/contract.md#people-in-the-loop): a turn waits for a person's approval
or answer, holding no worker, and resumes exactly once after the decision — through the inbox API."""

import pytest

from collab.models import Job, PersonAsk, Todo

APPROVED_TODO = [
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "ship it"}}]},
    {"text": "after the call: {{last.text}}"},
]
ASK = [
    {"tool_calls": [{"name": "ask_person", "arguments": {"question": "Which colour?", "choices": ["red", "blue"]}}]},
    {"text": "the person said {{last.text}}"},
]


def _turn(api, sid, prompt="go"):
    return api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]


def _waiting(api, run_queued, sid, prompt="go"):
    eid = _turn(api, sid, prompt)
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["status"] == "waiting"
    return eid


def _tool_results(sid):
    from collab.models import Message

    return list(Message.objects.filter(session_id=sid, role="tool").order_by("depth").values_list("text", flat=True))


def test_an_approved_call_waits_holding_no_worker_then_runs_exactly_once(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    eid = _waiting(api, run_queued, sid)
    job = Job.objects.get(pk=eid)
    assert job.lease_expires_at is None and job.model_calls == 1  # no lease: no worker holds it
    assert not Todo.objects.filter(session_id=sid).exists()  # nothing ran before the decision

    items = api.get("/api/inbox").json()["items"]
    assert [(i["kind"], i["tool"], i["arguments"], i["session"], i["agent"]) for i in items] == [
        ("approval", "todo_create", {"subject": "ship it"}, sid, "bot")]
    events = [e["type"] for e in api.get(f"/api/sessions/{sid}/events").json()["events"]]
    assert "approval.requested" in events and "job.waiting" in events

    decided = api.post(f"/api/inbox/{items[0]['id']}", {"decision": "approve"})
    assert decided.status_code == 200 and decided.json()["status"] == "approved", decided.content
    assert api.get(f"/api/executions/{eid}").json()["status"] == "queued"  # back to a worker
    run_queued()
    done = api.get(f"/api/executions/{eid}").json()
    assert done["status"] == "succeeded" and done["model_calls"] == 2 and done["tool_calls"] == 1, done
    assert done["result"].startswith("after the call: todo ")
    assert Todo.objects.filter(session_id=sid, subject="ship it").count() == 1
    assert api.get("/api/inbox").json()["items"] == []

    again = api.post(f"/api/inbox/{items[0]['id']}", {"decision": "reject"})
    assert again.status_code == 409 and again.json()["code"] == "already_decided"
    run_queued()
    assert Todo.objects.filter(session_id=sid).count() == 1
    decided_events = [e for e in api.get(f"/api/sessions/{sid}/events").json()["events"] if e["type"] == "approval.decided"]
    assert [(e["payload"]["decision"], e["payload"]["by"]) for e in decided_events] == [("approved", "member")]


def test_an_edited_approval_runs_the_call_with_the_edited_arguments(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["*"])
    eid = _waiting(api, run_queued, sid)
    item = api.get("/api/inbox").json()["items"][0]
    bad = api.post(f"/api/inbox/{item['id']}", {"decision": "approve", "arguments": {"subjectt": "x"}})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_arguments"
    assert PersonAsk.objects.get(pk=item["id"]).status == "pending"  # a refused decision changes nothing
    ok = api.post(f"/api/inbox/{item['id']}", {"decision": "approve", "arguments": {"subject": "ship it on Monday"}})
    assert ok.status_code == 200
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["status"] == "succeeded"
    assert list(Todo.objects.filter(session_id=sid).values_list("subject", flat=True)) == ["ship it on Monday"]


def test_a_rejected_call_tells_the_model_why_and_runs_nothing(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    eid = _waiting(api, run_queued, sid)
    item = api.get("/api/inbox").json()["items"][0]
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "reject", "reason": "not this week"}).status_code == 200
    run_queued()
    done = api.get(f"/api/executions/{eid}").json()
    assert done["status"] == "succeeded" and done["result"] == "after the call: rejected: not this week"
    assert not Todo.objects.filter(session_id=sid).exists()


def test_ask_person_pauses_until_an_answer_among_its_choices(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, ASK)
    eid = _waiting(api, run_queued, sid)
    item = api.get("/api/inbox").json()["items"][0]
    assert (item["kind"], item["question"], item["choices"], item["to"]) == ("question", "Which colour?", ["red", "blue"], None)
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).json()["code"] == "invalid_decision"
    off = api.post(f"/api/inbox/{item['id']}", {"decision": "answer", "answer": "green"})
    assert off.status_code == 400 and off.json()["code"] == "invalid_answer"
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "answer", "answer": "blue"}).status_code == 200
    run_queued()
    done = api.get(f"/api/executions/{eid}").json()
    assert done["status"] == "succeeded" and done["result"] == "the person said blue"
    assert _tool_results(sid) == ["blue"]


def test_a_question_to_a_named_person_is_theirs_alone(team, scripted_session, api_as, run_queued):
    script = [{"tool_calls": [{"name": "ask_person", "arguments": {"question": "Budget?", "to": "maintainer"}}]},
              {"text": "ok {{last.text}}"}]
    api, sid = scripted_session(team.member, script)
    eid = _waiting(api, run_queued, sid)
    assert api.get("/api/inbox").json()["items"] == []
    maintainer = api_as(team.maintainer)
    (item,) = maintainer.get("/api/inbox").json()["items"]
    assert item["to"] == "maintainer"
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "answer", "answer": "10k"}).status_code == 404
    assert maintainer.post(f"/api/inbox/{item['id']}", {"decision": "answer", "answer": "10k"}).status_code == 200
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["result"] == "ok 10k"


def test_ask_person_naming_someone_who_may_not_answer_is_an_error_result_not_a_pause(team, scripted_session, run_queued):
    script = [{"tool_calls": [{"name": "ask_person", "arguments": {"question": "?", "to": "outsider"}}]},
              {"text": "{{last.text}}"}]
    api, sid = scripted_session(team.member, script)
    eid = _turn(api, sid)
    run_queued()
    done = api.get(f"/api/executions/{eid}").json()
    assert done["status"] == "succeeded" and done["result"].startswith("unknown_person:"), done
    assert not PersonAsk.objects.exists()


def test_who_may_see_and_decide_an_item(team, scripted_session, api_as, run_queued, make_user):
    from accounts.models import Membership

    colleague = make_user("colleague")
    Membership.objects.create(user=colleague, project=team.alpha, role="member")
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    _waiting(api, run_queued, sid)
    item = api.get("/api/inbox").json()["items"][0]
    outsider, viewer = api_as(team.outsider), api_as(team.viewer)
    assert outsider.get("/api/inbox").json()["items"] == []
    assert viewer.get("/api/inbox").json()["items"] == []
    assert outsider.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code == 404
    assert api.post("/api/inbox/ffffffffffff", {"decision": "approve"}).status_code == 404
    assert viewer.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code in (403, 404)
    no_scope = api_as(team.member, scopes=["read", "write"])
    assert no_scope.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code == 403
    # a private session: its asks leave the inbox of a member it is hidden from, who gets 404s
    other = api_as(colleague)
    assert [i["id"] for i in other.get("/api/inbox").json()["items"]] == [item["id"]]
    assert api.patch(f"/api/sessions/{sid}", {"visibility": "private"}).status_code == 200
    assert other.get("/api/inbox").json()["items"] == []
    assert other.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code == 404
    assert [i["id"] for i in api_as(team.maintainer).get("/api/inbox").json()["items"]] == [item["id"]]
    assert PersonAsk.objects.get(pk=item["id"]).status == "pending"


def test_cancelling_a_waiting_turn_ends_it_and_closes_its_items(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    eid = _waiting(api, run_queued, sid)
    item = api.get("/api/inbox").json()["items"][0]
    version = api.get(f"/api/executions/{eid}").json()["version"]
    r = api.post(f"/api/executions/{eid}/commands",
                 {"command_id": "c1", "action": "execution.cancel", "expected_version": version, "payload": {}})
    assert r.status_code == 202, r.content
    assert api.get(f"/api/executions/{eid}").json()["status"] == "cancelled"
    assert PersonAsk.objects.get(pk=item["id"]).status == "closed"
    assert api.get("/api/inbox").json()["items"] == []
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code == 409
    assert _tool_results(sid) == ["cancelled: the execution was cancelled before this tool call finished"]
    run_queued()
    assert not Todo.objects.filter(session_id=sid).exists()


def test_an_item_past_its_expiry_resolves_as_rejected_expired(team, scripted_session, run_queued):
    from datetime import timedelta

    from django.utils import timezone

    from collab.services.reconcile import reconcile

    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"],
                                limits={"approval_expires_s": 3600})
    eid = _waiting(api, run_queued, sid)
    ask = PersonAsk.objects.get()
    assert ask.expires_at is not None
    assert reconcile()["expired_asks"] == []  # not yet
    PersonAsk.objects.filter(pk=ask.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert reconcile()["expired_asks"] == [ask.pk]
    run_queued()
    done = api.get(f"/api/executions/{eid}").json()
    assert done["status"] == "succeeded" and done["result"] == "after the call: rejected: expired"
    assert not Todo.objects.filter(session_id=sid).exists()


def test_a_waiting_turn_keeps_its_branch_a_later_turn_runs_after_it(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    first = _waiting(api, run_queued, sid)
    second = _turn(api, sid, "next")
    run_queued()
    assert api.get(f"/api/executions/{second}").json()["status"] == "queued"  # behind the waiting turn
    item = api.get("/api/inbox").json()["items"][0]
    api.post(f"/api/inbox/{item['id']}", {"decision": "reject", "reason": "no"})
    run_queued()  # the first resumes and ends; the second runs, and waits at its own call
    assert api.get(f"/api/executions/{first}").json()["status"] == "succeeded"
    assert api.get(f"/api/executions/{second}").json()["status"] == "waiting"


@pytest.mark.parametrize("approvals,code", [(["no_such_tool"], "invalid_approvals"), ("todo_create", None)])
def test_a_spec_names_only_tools_of_its_toolset(team, api_as, approvals, code):
    r = api_as(team.owner).post("/api/projects/alpha/agent-specs",
                                {"agent_id": "x", "provider": "scripted", "approvals": approvals})
    assert r.status_code in (400, 422), r.content
    if code:
        assert r.json()["code"] == code
    ok = api_as(team.owner).post("/api/projects/alpha/agent-specs",
                                 {"agent_id": "y", "provider": "scripted", "approvals": ["*"]})
    assert ok.status_code == 201 and ok.json()["approvals"] == ["*"]


def test_webhooks_hear_of_each_request_and_decision_and_people_get_an_email(team, scripted_session, api_as,
                                                                            run_queued, settings, mailoutbox):
    from collab.models import WebhookDelivery
    from collab.services.notify import send_ask_email

    from collab.conf.webhook_hosts import parse_webhook_hosts
    from tests.conftest import WEBHOOK_TEST_HOSTS

    settings.TRELLIS_EMAIL_NOTIFICATIONS = True
    settings.TRELLIS_WEBHOOK_HOSTS = parse_webhook_hosts(WEBHOOK_TEST_HOSTS)
    for person, address in ((team.member, "member@example.com"), (team.maintainer, "lead@example.com"),
                            (team.viewer, "viewer@example.com")):
        person.email = address
        person.save(update_fields=["email"])
    hook = api_as(team.owner).post("/api/projects/alpha/webhooks", {"url": "http://127.0.0.1:9/hook"})
    assert hook.status_code == 201, hook.content
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    eid = _waiting(api, run_queued, sid)
    (requested,) = WebhookDelivery.objects.filter(event="ask.requested")
    assert requested.payload["ask"]["tool"] == "todo_create" and requested.payload["execution"]["id"] == eid
    assert requested.payload["execution"]["status"] == "waiting"

    ask = PersonAsk.objects.get()
    assert send_ask_email(ask.pk) == 2  # the member and the maintainer may decide; the viewer may not
    assert sorted(m.to[0] for m in mailoutbox) == ["lead@example.com", "member@example.com"]
    assert "/inbox" in mailoutbox[0].body and "todo_create" in mailoutbox[0].body

    api.post(f"/api/inbox/{ask.pk}", {"decision": "approve"})
    (decided,) = WebhookDelivery.objects.filter(event="ask.decided")
    assert decided.payload["ask"]["status"] == "approved" and decided.payload["ask"]["decided_by"] == "member"
    assert send_ask_email(ask.pk) == 0  # decided: nobody is asked any more
    run_queued()
    assert WebhookDelivery.objects.filter(event="execution.finished", job_id=eid).count() == 1


@pytest.mark.parametrize("kind,decision,extra,recorded", [
    ("approval", "approve", {}, {}),
    ("approval", "approve", {"arguments": {"subject": "x"}}, {"arguments": {"subject": "x"}}),
    ("approval", "reject", {"reason": "  "}, {"reason": "rejected by a person"}),
    ("approval", "reject", {"reason": "later"}, {"reason": "later"}),
    ("question", "answer", {"answer": " blue "}, {"answer": "blue"}),
    ("question", "reject", {}, {"reason": "rejected by a person"}),
])
def test_what_each_decision_records(kind, decision, extra, recorded):
    from collab.services.asks import check_decision

    assert check_decision(PersonAsk(kind=kind, choices=[]), decision, **extra) == recorded


@pytest.mark.parametrize("kind,decision,extra,code", [
    ("approval", "answer", {"answer": "x"}, "invalid_decision"),
    ("question", "approve", {}, "invalid_decision"),
    ("approval", "approve", {"arguments": ["not", "an", "object"]}, "invalid_arguments"),
    ("question", "answer", {"answer": ""}, "invalid_answer"),
    ("question", "answer", {"answer": "x" * 20_001}, "invalid_answer"),
    ("approval", "reject", {"reason": "x" * 2_001}, "invalid_reason"),
])
def test_a_decision_that_does_not_fit_its_item_is_refused(kind, decision, extra, code):
    from collab.errors import Invalid
    from collab.services.asks import check_decision

    with pytest.raises(Invalid) as refused:
        check_decision(PersonAsk(kind=kind, choices=[]), decision, **extra)
    assert refused.value.code == code


@pytest.mark.parametrize("status,decision,result", [
    ("approved", {}, None),
    ("answered", {"answer": "42"}, "42"),
    ("rejected", {"reason": "no"}, "rejected: no"),
    ("expired", {"reason": "expired"}, "rejected: expired"),
])
def test_what_a_decided_call_answers_without_running(status, decision, result):
    from collab.services.asks import call_result

    assert call_result(PersonAsk(status=status, decision=decision)) == result


def test_the_graph_marks_a_branch_whose_turn_waits_for_a_person(team, scripted_session, browser_of, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    _waiting(api, run_queued, sid)
    page = browser_of(team.member).get(f"/s/{sid}/dag").content.decode()
    assert 'data-live="waiting for a person"' in page and "main — waiting for a person" in page
    item = api.get("/api/inbox").json()["items"][0]
    api.post(f"/api/inbox/{item['id']}", {"decision": "approve"})
    run_queued()
    assert "waiting for a person" not in browser_of(team.member).get(f"/s/{sid}/dag").content.decode()
