"""Deciding from the session page's graph (docs/web-app.md#inbox): the node whose tool call waits
for a person is marked for everyone who sees the session, and, for a person who may decide it,
carries the inbox's controls (approve, edit, reject, answer) below the graph, posting to the same
decide view; the decision answers for the graph, a refusal comes back beside the card, and the
graph's next render shows the turn going on. Untrusted arguments and questions are escaped."""

import re

from collab.models import Job, PersonAsk, Todo

from tests.collab.test_people_in_the_loop import ASK

HX = {"HTTP_HX_REQUEST": "true"}
SCRIPTED_TODO = [
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "<img src=x onerror=alert(1)>"}}]},
    {"text": "after the call: {{last.text}}"},
]


def _waiting(api, run_queued, sid) -> tuple[str, PersonAsk]:
    eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"]
    run_queued()
    assert Job.objects.get(pk=eid).status == "waiting"
    return eid, PersonAsk.objects.get(job_id=eid)


def _dag(client, sid) -> str:
    r = client.get(f"/s/{sid}/dag", **HX)  # the live block, as the page re-renders it on each event
    assert r.status_code == 200
    return r.content.decode()


def _cards(html: str) -> list[str]:
    return re.findall(r'<li class="dag-ask [^"]*" id="dag-ask-([^"]+)"', html)


def _waiting_nodes(html: str) -> list[str]:
    return re.findall(r'<a class="node [^"]*\bwaiting\b[^"]*" [^>]*data-node="([^"]+)"', html)


def test_the_waiting_node_carries_the_inboxs_controls_and_approving_there_resumes_the_turn(
        team, scripted_session, browser_of, run_queued):
    api, sid = scripted_session(team.member, SCRIPTED_TODO, approvals=["todo_create"])
    eid, ask = _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    html = _dag(member, sid)
    assert _waiting_nodes(html) == [ask.call_message_id] and _cards(html) == [ask.pk]
    assert f'data-ask="{ask.pk}" aria-describedby="dag-ask-{ask.pk}"' in html  # the node is described by its card
    assert "wants to call <code>todo_create</code>" in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html  # escaped, never markup
    for control in ('value="approve"', "Edit and approve", "Reject the call", 'name="place" value="graph"',
                    f'hx-target="#dag-ask-{ask.pk}"'):
        assert control in html, control
    assert _cards(member.get(f"/s/{sid}/").content.decode()) == [ask.pk]  # the whole page has it too

    viewer = _dag(browser_of(team.viewer), sid)  # sees the session, may not decide
    assert _waiting_nodes(viewer) == [ask.call_message_id] and _cards(viewer) == []
    assert "aria-describedby" not in viewer and "/inbox/" not in viewer

    r = member.post(f"/inbox/{ask.pk}", {"decision": "approve", "place": "graph"}, **HX)
    assert r.status_code == 200, r.content
    fragment = r.content.decode()
    assert f'id="dag-ask-{ask.pk}" role="status">Approved. The turn goes on.' in fragment
    assert 'id="needs-you"' in fragment and 'hx-swap-oob="true"' in fragment  # the header's count follows
    assert Job.objects.get(pk=eid).status == "queued"
    assert _cards(_dag(member, sid)) == [] and _waiting_nodes(_dag(member, sid)) == []
    run_queued()
    assert Job.objects.get(pk=eid).status == "succeeded"
    assert Todo.objects.filter(session_id=sid).count() == 1

    again = member.post(f"/inbox/{ask.pk}", {"decision": "reject", "place": "graph"}, **HX)
    assert again.status_code == 200 and "already decided (approved)" in again.content.decode()
    assert f'id="dag-ask-{ask.pk}"' in again.content.decode()  # the graph's card, not the inbox's item


def test_a_bad_edit_from_the_graph_is_refused_beside_the_card_and_a_plain_form_returns_to_the_session(
        team, scripted_session, browser_of, run_queued):
    api, sid = scripted_session(team.member, SCRIPTED_TODO, approvals=["*"])
    eid, ask = _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    refused = member.post(f"/inbox/{ask.pk}", {"decision": "approve", "place": "graph",
                                               "arguments": '{"subjectt": "<b>x</b>"}'}, **HX).content.decode()
    assert refused.lstrip().startswith(f'<li class="dag-ask kind-approval" id="dag-ask-{ask.pk}"')
    assert "the edited arguments do not fit todo_create" in refused and 'aria-invalid="true"' in refused
    assert "&quot;subjectt&quot;: &quot;&lt;b&gt;x&lt;/b&gt;&quot;" in refused  # what was typed, kept and escaped
    assert PersonAsk.objects.get(pk=ask.pk).status == "pending"

    r = member.post(f"/inbox/{ask.pk}", {"decision": "reject", "reason": "not now", "place": "graph"})
    assert r.status_code == 302 and r["Location"] == f"/s/{sid}/?branch={ask.branch_id}"
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["result"] == "after the call: rejected: not now"


def test_a_question_is_answered_from_the_graph(team, scripted_session, browser_of, run_queued):
    api, sid = scripted_session(team.member, ASK)
    eid, ask = _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    html = _dag(member, sid)
    assert _cards(html) == [ask.pk] and "Which colour?" in html and html.count('class="choice"') == 2
    assert member.post(f"/inbox/{ask.pk}", {"decision": "answer", "answer": "blue", "place": "graph"},
                       **HX).status_code == 200
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["result"] == "the person said blue"


def test_a_replay_shows_no_controls(team, scripted_session, browser_of, run_queued):
    api, sid = scripted_session(team.member, SCRIPTED_TODO, approvals=["todo_create"])
    _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    seq = team.alpha.sessions.get(pk=sid).last_event_seq
    replay = member.get(f"/s/{sid}/?at={seq}").content.decode()
    assert _cards(replay) == [] and _waiting_nodes(replay) == []
