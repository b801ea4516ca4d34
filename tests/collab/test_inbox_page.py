"""The inbox page and the "Needs you" count (docs/web-app.md#inbox): a waiting turn's item listed
with its context, decided through the page's forms exactly as through the API (approve, edit,
reject, answer, a held delivery), its turn resumed; a refusal shown beside the item; nothing of
it for people who may not decide it; the header's count in a few queries however many items."""

import re

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils.html import escape

from accounts.models import Membership
from collab.models import HeldDelivery, Job, PersonAsk, Todo

from tests.collab.test_people_in_the_loop import APPROVED_TODO, ASK
HX = {"HTTP_HX_REQUEST": "true"}


def _waiting(api, run_queued, sid) -> tuple[str, PersonAsk]:
    eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"]
    run_queued()
    assert Job.objects.get(pk=eid).status == "waiting"
    return eid, PersonAsk.objects.get(job_id=eid)


def _page(client) -> str:
    r = client.get("/inbox")
    assert r.status_code == 200
    return r.content.decode()


def _count(html: str) -> int:
    return int(re.search(r'<a id="needs-you"[^>]*>Needs you <span class="count"[^>]*>(\d+)</span>', html).group(1))


def _items(html: str) -> list[str]:
    return re.findall(r'<li class="inbox-item [^"]*" id="item-[^"]+" data-item="([^"]+)"', html)


def test_the_inbox_shows_an_item_in_context_and_approving_it_resumes_the_turn(team, scripted_session, browser_of,
                                                                                run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    eid, ask = _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    html = _page(member)
    assert _items(html) == [ask.pk] and _count(html) == 1
    assert f'href="/s/{sid}/?branch={ask.branch_id}">test</a> › main' in html and "· alpha" in html
    assert "<strong>bot</strong>" in html and "wants to call <code>todo_create</code>" in html
    assert "{\n  &quot;subject&quot;: &quot;ship it&quot;\n}" in html  # indented JSON, escaped
    assert "For anyone who may post in the session" in html and "no expiry" in html
    assert "1 item waits for you." in html
    home = member.get("/").content.decode()
    assert "1 item needs you</strong> → Inbox" in home and _count(home) == 1

    session_page = member.get(f"/s/{sid}/").content.decode()
    assert "Waiting for a person" in session_page and f'href="/inbox#item-{ask.pk}"' in session_page
    viewer_page = browser_of(team.viewer).get(f"/s/{sid}/").content.decode()
    assert "Waiting for a person" in viewer_page and "/inbox#item-" not in viewer_page  # not theirs to decide

    r = member.post(f"/inbox/{ask.pk}", {"decision": "approve"}, **HX)
    assert r.status_code == 200, r.content
    fragment = r.content.decode()
    assert 'hx-swap-oob="true"' in fragment and _count(fragment) == 0 and "Approved. Nothing waits for you." in fragment
    assert Job.objects.get(pk=eid).status == "queued"
    run_queued()
    assert Job.objects.get(pk=eid).status == "succeeded"
    assert list(Todo.objects.filter(session_id=sid).values_list("subject", flat=True)) == ["ship it"]
    html = _page(member)
    assert _items(html) == [] and _count(html) == 0 and "Nothing waits for you." in html
    assert "Waiting for a person" not in member.get(f"/s/{sid}/").content.decode()
    assert "→ Inbox" not in member.get("/").content.decode()

    # a second decision is refused beside the item, never a 500
    again = member.post(f"/inbox/{ask.pk}", {"decision": "reject"})
    assert again.status_code == 409 and "already decided (approved)" in again.content.decode()
    in_place = member.post(f"/inbox/{ask.pk}", {"decision": "reject"}, **HX)
    assert in_place.status_code == 200 and "already decided (approved)" in in_place.content.decode()
    assert PersonAsk.objects.get(pk=ask.pk).status == "approved"


def test_an_edit_is_checked_like_the_apis_and_a_bad_one_changes_nothing(team, scripted_session, browser_of,
                                                                      run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["*"])
    eid, ask = _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    for typed, says in (('{"subject": ', "arguments is not valid JSON"),
                        ('["ship"]', "arguments must be a JSON object"),
                        ('{"subjectt": "x"}', "the edited arguments do not fit todo_create")):
        r = member.post(f"/inbox/{ask.pk}", {"decision": "approve", "arguments": typed})
        html = r.content.decode()
        assert r.status_code == 400 and says in html, (typed, html)
        assert _items(html) == [ask.pk] and 'aria-invalid="true"' in html
        assert f">{escape(typed)}</textarea>" in html  # what was typed, kept
        fragment = member.post(f"/inbox/{ask.pk}", {"decision": "approve", "arguments": typed}, **HX).content.decode()
        assert says in fragment and fragment.lstrip().startswith(f'<li class="inbox-item kind-approval" id="item-{ask.pk}"')
    assert PersonAsk.objects.get(pk=ask.pk).status == "pending" and Job.objects.get(pk=eid).status == "waiting"

    r = member.post(f"/inbox/{ask.pk}", {"decision": "approve", "arguments": '{"subject": "ship it on Monday"}'})
    assert r.status_code == 302 and r["Location"] == "/inbox"
    run_queued()
    assert Job.objects.get(pk=eid).status == "succeeded"
    assert list(Todo.objects.filter(session_id=sid).values_list("subject", flat=True)) == ["ship it on Monday"]


def test_rejecting_and_answering_through_the_page(team, scripted_session, browser_of, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    rejected, ask = _waiting(api, run_queued, sid)
    member = browser_of(team.member)
    assert member.post(f"/inbox/{ask.pk}", {"decision": "reject", "reason": "not this week"}).status_code == 302

    api2, sid2 = scripted_session(team.member, ASK, agent_id="asker")
    answered, question = _waiting(api2, run_queued, sid2)
    html = _page(member)
    assert _items(html) == [question.pk] and "<strong>asker</strong>" in html and "asks" in html
    assert "Which colour?" in html and html.count('class="choice"') == 2
    off = member.post(f"/inbox/{question.pk}", {"decision": "answer", "answer": "green"}, **HX).content.decode()
    assert "answer must be one of the choices" in off and PersonAsk.objects.get(pk=question.pk).status == "pending"
    assert member.post(f"/inbox/{question.pk}", {"decision": "answer", "answer": "blue"}).status_code == 302

    run_queued()
    assert api.get(f"/api/executions/{rejected}").json()["result"] == "after the call: rejected: not this week"
    assert api2.get(f"/api/executions/{answered}").json()["result"] == "the person said blue"
    assert not Todo.objects.filter(session_id=sid).exists()


def test_a_held_delivery_is_decided_in_the_inbox(team, scripted_session, browser_of, api_as, run_queued):
    from tests.collab.test_watch_policy import _two_branches

    api, sid, main, _ = _two_branches(team, scripted_session, api_as)  # under confirm_deliveries
    sent = api.post(f"/api/branches/{main}/tools/send_message", {"arguments": {"to": "target", "message": "ping <b>"}})
    assert sent.json()["details"]["held"] is True, sent.json()
    hold = HeldDelivery.objects.get()

    member = browser_of(team.member)
    html = _page(member)
    assert _items(html) == [f"hold-{hold.pk}"] and "held delivery" in html and "<code>send_message</code>" in html
    assert "&quot;message&quot;: &quot;ping &lt;b&gt;&quot;" in html and ">Deliver</button>" in html
    bad = member.post(f"/inbox/hold-{hold.pk}", {"decision": "approve", "arguments": "{}"}).content.decode()
    assert "a held delivery cannot be edited" in bad
    assert member.post(f"/inbox/hold-{hold.pk}", {"decision": "approve"}).status_code == 302
    hold.refresh_from_db()
    assert hold.status == "approved" and hold.result_job_id
    assert _items(_page(member)) == []


def test_people_who_may_not_decide_an_item_never_see_it(team, scripted_session, browser_of, make_user, run_queued):
    colleague = make_user("colleague")
    Membership.objects.create(user=colleague, project=team.alpha, role="member")
    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    _, ask = _waiting(api, run_queued, sid)
    assert _items(_page(browser_of(colleague))) == [ask.pk]
    assert api.patch(f"/api/sessions/{sid}", {"visibility": "private"}).status_code == 200

    for person in (team.outsider, team.viewer, colleague):
        client = browser_of(person)
        html = _page(client)
        assert _items(html) == [] and _count(html) == 0 and "ship it" not in html, person.username
        assert client.post(f"/inbox/{ask.pk}", {"decision": "approve"}).status_code in (403, 404), person.username
        fragment = client.post(f"/inbox/{ask.pk}", {"decision": "approve"}, **HX)
        assert "not yours to decide" in fragment.content.decode() and "ship it" not in fragment.content.decode()
    assert browser_of(team.outsider).get(f"/s/{sid}/").status_code == 404
    assert _items(_page(browser_of(team.maintainer))) == [ask.pk]  # maintainers see every session
    assert PersonAsk.objects.get(pk=ask.pk).status == "pending"


def test_the_needs_you_count_costs_the_same_few_queries_however_many_items(team, scripted_session, browser_of,
                                                                          run_queued):
    member = browser_of(team.member)

    def count() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            r = member.get("/inbox/count", **HX)
        assert r.status_code == 200
        return len(queries), _count(r.content.decode())

    api, sid = scripted_session(team.member, APPROVED_TODO, approvals=["todo_create"])
    _waiting(api, run_queued, sid)
    few, shown = count()
    assert shown == 1
    for i in range(4):
        other = api.post("/api/projects/alpha/sessions", {"title": f"more {i}", "agent_id": "bot"}).json()["id"]
        _waiting(api, run_queued, other)
    many, shown = count()
    assert shown == 5 and many == few and many <= 4, (few, many)  # the login's session and user, then the count

    # a full page reads the count once (header and home line share it); a logged-out poll stops polling
    with CaptureQueriesContext(connection) as home:
        member.get("/")
    assert sum('"collab_personask"' in q["sql"] for q in home.captured_queries) == 1
    assert Client().get("/inbox/count", **HX).status_code == 286
