"""Where the two toolsets meet: an OpenWork sub-agent is directed by its parent alone
(docs/contract.md#the-openwork-toolset) — other agents can read it, not give it work — and it
is not listed at the top level, through the collab tools as through the pages."""

from collab.models import Branch, Job, Message


def ow_child(scripted_session, team):
    """An OpenWork session with one explorer (its first turn queued: no worker here)."""
    api, sid = scripted_session(team.member, [], agent_id="ow", toolset="openwork")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"
    r = api.post(f"/api/branches/{address}/tools/spawn_agent", {"arguments": {"task_name": "scout", "message": "look"}})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    child = Branch.objects.get(task_name="scout")
    return api, sid, child


def test_a_collab_agent_cannot_deliver_work_to_someone_elses_sub_agent(team, scripted_session):
    """send_message and agent(to=…) aimed at a sub-agent (by SID:HEAD or by its name)
    answer sub_agent_read_only and create nothing; reading its transcript stays possible."""
    api, ow_sid, child = ow_child(scripted_session, team)
    collab_api, sid = scripted_session(team.member, [], agent_id="plain")
    assert collab_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    me = f"{sid}:{collab_api.get(f'/api/sessions/{sid}').json()['head']}"
    jobs = Job.objects.count()
    for tool, arguments in [("send_message", {"to": child.address, "message": "do this"}),
                            ("agent", {"to": child.address, "prompt": "do this"})]:
        body = collab_api.post(f"/api/branches/{me}/tools/{tool}", {"arguments": arguments}).json()
        assert body["is_error"] and body["details"]["code"] == "sub_agent_read_only", body
    assert Job.objects.count() == jobs
    body = collab_api.post(f"/api/branches/{me}/tools/read_conversation", {"arguments": {"session_id": child.address}}).json()
    assert not body["is_error"] and "look" in body["text"]


def test_sub_agents_are_not_listed_at_the_top_level_but_by_their_parent(team, scripted_session, client):
    """The collab toolset's list_agents(scope="all") lists the parent session, not the child; the
    project page lists the child under its parent only; the parent's list_agents lists it."""
    api, ow_sid, child = ow_child(scripted_session, team)
    collab_api, sid = scripted_session(team.member, [], agent_id="plain")
    assert collab_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    me = f"{sid}:{collab_api.get(f'/api/sessions/{sid}').json()['head']}"
    listed = collab_api.post(f"/api/branches/{me}/tools/list_agents", {"arguments": {"scope": "all"}}).json()["text"]
    assert ow_sid in listed and child.session_id not in listed
    client.force_login(team.member)
    page = client.get("/p/alpha/").content.decode()
    assert f"/s/{ow_sid}/" in page  # the child only under its parent's row
    assert page.count(f"/s/{child.session_id}/") == 1 and f'data-child="{child.session_id}"' in page
    parent = f"{ow_sid}:{Branch.objects.get(session_id=ow_sid, task_name__isnull=True).tip_id}"
    rows = api.post(f"/api/branches/{parent}/tools/list_agents", {"arguments": {}}).json()["details"]["agents"]
    assert [(r["task_name"], r["status"]) for r in rows] == [("scout", "running")]


def test_where_bubblewrap_cannot_start_bash_is_not_offered_and_the_page_says_why(team, scripted_session, client, tmp_path, monkeypatch):
    """Bash never runs unsandboxed — without a working bwrap it is neither offered
    nor dispatched, and the project page shows the reason; the other workspace tools stay."""
    from io import StringIO

    from django.core.management import call_command

    import collab.tools.surface as surface

    call_command("workspace", "alpha", str(tmp_path), stdout=StringIO())
    client.force_login(team.member)
    page = client.get("/p/alpha/").content.decode()
    assert str(tmp_path) in page and "not offered" not in page  # bwrap works on this machine

    monkeypatch.setattr(surface, "sandbox_status", lambda: (False, "bubblewrap is not installed"))
    page = client.get("/p/alpha/").content.decode()
    assert "<code>bash</code> not offered: sandbox unavailable: bubblewrap is not installed" in page
    api, sid, child = ow_child(scripted_session, team)
    body = api.post(f"/api/branches/{child.address}/tools/bash", {"arguments": {"command": "echo hi"}}).json()
    assert body["is_error"] and body["details"]["code"] == "unknown_tool", body
    body = api.post(f"/api/branches/{child.address}/tools/list", {"arguments": {}}).json()
    assert not body["is_error"], body
    out = StringIO()
    call_command("workspace", "alpha", stdout=out)  # the operator's command probes bwrap for real
    assert out.getvalue() == f"workspace = {tmp_path}\nbash: sandboxed with bubblewrap\n"


def test_the_database_refuses_inconsistent_child_rows_on_its_own(team, scripted_session):
    """With the services bypassed, CHECKs and the
    unique index still refuse a malformed task_name, a duplicate under one parent, half-filled
    topology columns and a session that is its own parent."""
    from django.db import DataError, IntegrityError, transaction

    from collab.models import Session

    api, ow_sid, child = ow_child(scripted_session, team)
    parent = child.parent_branch
    attempts = {
        "malformed task_name": lambda: Branch.objects.create(session=child.session, parent_branch=parent, task_name="Bad-Name"),
        "49 characters": lambda: Branch.objects.create(session=child.session, parent_branch=parent, task_name="a" * 49),
        "duplicate under one parent": lambda: Branch.objects.create(session=child.session, parent_branch=parent, task_name="scout"),
        "parent without role": lambda: Session.objects.create(project_id=child.session.project_id, parent_session_id=ow_sid),
        "role without parent": lambda: Session.objects.create(project_id=child.session.project_id, agent_role="explorer"),
        "own parent": lambda: Session.objects.filter(pk=child.session_id).update(parent_session_id=child.session_id),
    }
    for label, attempt in attempts.items():
        try:
            with transaction.atomic():
                attempt()
        except (IntegrityError, DataError):  # PostgreSQL refuses 49 characters as too long for the column
            continue
        raise AssertionError(f"the database accepted: {label}")
    # the same name under another parent branch is fine
    other = Branch.objects.create(session=child.session, name="other")
    with transaction.atomic():
        Branch.objects.create(session=child.session, parent_branch=other, task_name="scout")


def test_a_huge_child_result_is_refused_as_agent_delivery_failed_with_its_full_text_kept(team, scripted_session):
    """An envelope of 4,000 tokens or more is refused (before, the body was bounded instead) —
    the parent reads a failed envelope ``agent_delivery_failed``
    naming the execution and the artifact that keeps the full text, readable by the parent's
    members — no result is lost. Turns run in-process as a worker runs them."""
    from collab.runtime.loop import run_job

    huge = "".join(f"line {n}: the explorer found something\n" for n in range(4000))  # ~150k characters
    api, sid = scripted_session(team.member, {"user": [{"text": "{{mailbox}}"}], "spawn": [{"text": "{{prompt}}"}]},
                                agent_id="ow-huge", toolset="openwork")
    parent_job = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"]
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"
    r = api.post(f"/api/branches/{address}/tools/spawn_agent", {"arguments": {"task_name": "big", "message": huge}})
    child_job = r.json()["details"]["execution_id"]
    assert run_job(child_job) == "succeeded"
    assert run_job(parent_job) == "succeeded"  # its first drain settles the owed result
    [envelope] = Message.objects.filter(session_id=sid, kind="agent_message")
    assert envelope.text.startswith("<agent_message>\n<task>big</task>\n<kind>failed</kind>\n<body>\nagent_delivery_failed: ")
    assert len(envelope.text) < 1000 and "line 0:" not in envelope.text and child_job in envelope.text
    artifact_id = Job.objects.get(pk=child_job).result_artifact_id
    assert f"(full text: artifact {artifact_id})" in envelope.text
    full = api.get(f"/api/artifacts/{artifact_id}")
    assert full.status_code == 200 and full.content.decode() == huge


def test_listing_children_costs_the_same_queries_for_two_or_eight(team, scripted_session, api_as):
    """No N+1: OpenWork's list_agents and the session page's agent rail read a constant
    number of queries however many children there are."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from collab.models import Session
    from collab.selectors.children import child_rail, list_children

    assert api_as(team.owner).patch("/api/projects/alpha/limits", {"max_active_turns": 20}).status_code == 200
    api, ow_sid, first = ow_child(scripted_session, team)
    parent = first.parent_branch

    def queries() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as listing:
            rows = list_children(parent)
        with CaptureQueriesContext(connection) as rail:
            tiles = child_rail(Session.objects.get(pk=ow_sid))
        assert len(rows) == len(tiles)
        return len(listing), len(rail) - 1  # minus the session lookup

    def spawn(n):
        r = api.post(f"/api/branches/{parent.session_id}:{parent.tip_id}/tools/spawn_agent",
                     {"arguments": {"task_name": f"kid_{n}", "message": "look"}})
        assert not r.json()["is_error"], r.content

    spawn(1)
    two = queries()
    for n in range(2, 8):
        spawn(n)
    assert queries() == two and two[0] == 1
