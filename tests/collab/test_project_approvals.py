"""The project's approvals (docs/contract.md#people-in-the-loop): the watch policy's way to make
every call of a tool, by any agent of the project, wait for a person — the project-wide
counterpart of an agent spec's ``approvals``, joined to it; set by owners through
``PATCH /api/projects/{slug}`` or the project page, audited, each ask saying which rule made it."""

import re

from collab.models import Event, Job, PersonAsk, Todo

from tests.collab.test_people_in_the_loop import APPROVED_TODO


def _turn(api, sid) -> str:
    return api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"]


def test_a_project_rule_makes_a_spec_without_approvals_wait_until_it_is_removed(team, scripted_session, api_as,
                                                                                 browser_of, run_queued):
    api, sid = scripted_session(team.member, APPROVED_TODO)  # the spec names no approvals
    owner = api_as(team.owner)
    r = owner.patch("/api/projects/alpha", {"approvals": ["todo_create"]})
    assert r.status_code == 200 and r.json()["approvals"] == ["todo_create"], r.content
    assert api.get("/api/projects/alpha").json()["approvals"] == ["todo_create"]  # every member reads it

    eid = _turn(api, sid)
    run_queued()
    assert Job.objects.get(pk=eid).status == "waiting"
    assert not Todo.objects.filter(session_id=sid).exists()
    (item,) = api.get("/api/inbox").json()["items"]
    assert (item["kind"], item["tool"], item["rule"]) == ("approval", "todo_create", "project")
    requested = [e for e in api.get(f"/api/sessions/{sid}/events").json()["events"] if e["type"] == "approval.requested"]
    assert [e["payload"]["rule"] for e in requested] == ["project"]
    for page in ("/inbox", f"/s/{sid}/dag"):  # the inbox's item and the graph's card say so too
        assert "(the project's approvals)" in browser_of(team.member).get(page, HTTP_HX_REQUEST="true").content.decode()
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "approve"}).status_code == 200
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["status"] == "succeeded"

    assert owner.patch("/api/projects/alpha", {"approvals": []}).json()["approvals"] == []
    later = _turn(api, sid)
    run_queued()
    assert api.get(f"/api/executions/{later}").json()["status"] == "succeeded"  # ran without asking
    assert Todo.objects.filter(session_id=sid).count() == 2
    assert PersonAsk.objects.filter(job_id=later).count() == 0


def test_the_effective_set_is_the_union_and_the_specs_rule_is_named_when_both_name_the_tool(
        team, scripted_session, api_as, run_queued):
    script = [{"tool_calls": [{"name": "todo_create", "arguments": {"subject": "a"}},
                              {"name": "todo_list", "arguments": {}}]},
              {"text": "done"}]
    api, sid = scripted_session(team.member, script, approvals=["todo_create"])
    assert api_as(team.owner).patch("/api/projects/alpha", {"approvals": ["*"]}).status_code == 200
    eid = _turn(api, sid)
    run_queued()
    first = PersonAsk.objects.get(job_id=eid)
    assert (first.tool, first.rule) == ("todo_create", "spec")
    assert api.post(f"/api/inbox/{first.pk}", {"decision": "approve"}).status_code == 200
    run_queued()
    second = PersonAsk.objects.get(job_id=eid, status="pending")
    assert (second.tool, second.rule) == ("todo_list", "project")  # "*": every tool, the spec's or not


def test_a_question_is_not_an_approval_whatever_the_project_names(team, scripted_session, api_as, run_queued):
    script = [{"tool_calls": [{"name": "ask_person", "arguments": {"question": "Which?"}}]}, {"text": "{{last.text}}"}]
    api, sid = scripted_session(team.member, script)
    assert api_as(team.owner).patch("/api/projects/alpha", {"approvals": ["ask_person"]}).status_code == 200
    eid = _turn(api, sid)
    run_queued()
    (item,) = api.get("/api/inbox").json()["items"]
    assert (item["kind"], item["rule"]) == ("question", None)
    assert api.post(f"/api/inbox/{item['id']}", {"decision": "answer", "answer": "this"}).status_code == 200
    run_queued()
    assert api.get(f"/api/executions/{eid}").json()["result"] == "this"


def test_unknown_tool_names_are_refused_and_change_nothing(team, api_as):
    owner = api_as(team.owner)
    assert owner.patch("/api/projects/alpha", {"approvals": ["bash"]}).status_code == 200  # an openwork tool
    for bad in (["no_such_tool"], ["todo_create", "rm -rf"], ["*", "\x00"]):
        r = owner.patch("/api/projects/alpha", {"approvals": bad})
        assert r.status_code == 400 and r.json()["code"] == "invalid_approvals", (bad, r.content)
    not_a_list = owner.patch("/api/projects/alpha", {"approvals": "todo_create"})
    assert not_a_list.status_code == 422 and not_a_list.json()["code"] == "invalid_request"
    assert owner.get("/api/projects/alpha").json()["approvals"] == ["bash"]
    assert owner.patch("/api/projects/alpha", {"approvals": ["bash", "bash", "*"]}).json()["approvals"] == ["bash", "*"]


def test_only_owners_set_the_projects_approvals_as_the_watch_policy(team, api_as):
    for who, status in ((team.member, 403), (team.maintainer, 403), (team.viewer, 403), (team.outsider, 404)):
        r = api_as(who).patch("/api/projects/alpha", {"approvals": ["todo_create"]})
        assert r.status_code == status, (who.username, r.content)
        assert api_as(who).patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == status
    assert api_as(team.owner).get("/api/projects/alpha").json()["approvals"] == []


def test_a_change_is_audited_once_and_a_repeat_records_nothing(team, api_as):
    owner = api_as(team.owner)
    owner.patch("/api/projects/alpha", {"approvals": ["todo_create"]})
    owner.patch("/api/projects/alpha", {"approvals": ["todo_create"]})
    updates = list(Event.objects.filter(project=team.alpha, type="project.updated").values_list("payload", flat=True))
    assert updates == [{"approvals": ["todo_create"]}]


def _checked(html: str) -> list[str]:
    fieldset = re.search(r'<fieldset class="approvals".*?</fieldset>', html, re.S).group(0)
    return re.findall(r'name="approvals" value="([^"]+)" checked', fieldset)


def test_the_project_page_shows_and_changes_the_tools_that_need_a_person(team, browser_of):
    owner = browser_of(team.owner)
    page = owner.get("/p/alpha/").content.decode()
    assert "Tools that need a person" in page and _checked(page) == []
    r = owner.post("/p/alpha/settings", {"watch_policy": "off", "approvals_shown": "1",
                                         "approvals": ["todo_create", "send_message"]})
    assert r.status_code == 302 and r["Location"].endswith("/p/alpha/#settings")
    team.alpha.refresh_from_db()
    assert team.alpha.approvals == ["todo_create", "send_message"]
    assert sorted(_checked(owner.get("/p/alpha/").content.decode())) == ["send_message", "todo_create"]

    # unchecking every box clears them; a form without the box list leaves them as they are
    owner.post("/p/alpha/settings", {"watch_policy": "off", "approvals_shown": "1"})
    team.alpha.refresh_from_db()
    assert team.alpha.approvals == []
    owner.post("/p/alpha/settings", {"watch_policy": "confirm_deliveries", "approvals_shown": "1", "approvals": ["*"]})
    owner.post("/p/alpha/settings", {"watch_policy": "off"})
    team.alpha.refresh_from_db()
    assert (team.alpha.approvals, team.alpha.watch_policy) == (["*"], "off")

    refused = owner.post("/p/alpha/settings", {"watch_policy": "off", "approvals_shown": "1",
                                               "approvals": ["<script>x</script>"]})
    assert refused.status_code == 400
    body = refused.content.decode()
    assert 'id="settings-error"' in body and "<script>x</script>" not in body
    team.alpha.refresh_from_db()
    assert team.alpha.approvals == ["*"]

    audit = owner.get("/p/alpha/audit").content.decode()
    assert "changed the project: approvals" in audit


def test_people_who_may_not_configure_see_the_rule_but_cannot_change_it(team, browser_of):
    team.alpha.approvals = ["todo_create"]
    team.alpha.save(update_fields=["approvals"])
    member = browser_of(team.member)
    page = member.get("/p/alpha/").content.decode()
    assert _checked(page) == ["todo_create"] and re.search(r'<fieldset class="approvals"[^>]* disabled', page)
    assert member.post("/p/alpha/settings", {"approvals_shown": "1"}).status_code == 403
    team.alpha.refresh_from_db()
    assert team.alpha.approvals == ["todo_create"]
