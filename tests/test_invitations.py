"""Membership is an invitation (docs/contract.md#visibility).

Adding someone to a project — API, project page or admin — creates a *pending* invitation.
Until the person accepts it they get nothing of the project: every API route, page, name
and socket answers like a project that does not exist; they see only the invitation (on
the projects page and at ``GET /api/invitations``). They may accept or decline; an owner
sees pending invitations (``status`` on the member list) and may cancel them. Every step is
a project-level audit Event. Rows made by trusted code (a new project's creator,
``manage.py demo``, fixtures) and rows that existed before the migration are accepted.
"""

from io import StringIO
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from accounts.models import Membership, Project
from collab.models import Branch, Event, Job
from collab.models.ids import new_id

ROOT = Path(__file__).resolve().parents[1]
ORIGIN = (b"origin", b"http://127.0.0.1")


# --- helpers -----------------------------------------------------------------------------------


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def project_events(slug: str, type_prefix: str = "member.") -> list[tuple]:
    return list(
        Event.objects.filter(project__slug=slug, session=None, type__startswith=type_prefix)
        .order_by("seq").values_list("type", "actor__username", "payload")
    )


def invitation_of(api, slug: str) -> dict:
    (invitation,) = [i for i in api.get("/api/invitations").json() if i["project"] == slug]
    return invitation


def masked(response, values: dict) -> tuple:
    """(status, body) with each value of ``{name: value}`` replaced by ``<name>`` (longest first)."""
    body = response.content.decode()
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[1])):
        body = body.replace(value, f"<{name}>")
    return response.status_code, body


@pytest.fixture
def alpha_rows(team, api_as):
    """A session of alpha with a queued turn on it and a uniquely named branch (through the API)."""
    owner, member = api_as(team.owner), api_as(team.member)
    r = owner.post("/api/projects/alpha/agent-specs", {"agent_id": "bot", "provider": "scripted", "script": []})
    assert r.status_code == 201, r.content
    sid = member.post("/api/projects/alpha/sessions", {"title": "alpha secret title", "agent_id": "bot"}).json()["id"]
    turn = member.post(f"/api/sessions/{sid}/turns", {"prompt": "alpha secret prompt"}).json()
    head = member.get(f"/api/sessions/{sid}").json()["head"]
    Branch.objects.filter(session_id=sid, name="main").update(name="alpha-only-agent")
    return type("Rows", (), {"sid": sid, "address": f"{sid}:{head}", "job_id": turn["execution_id"],
                             "name": "alpha-only-agent"})


def values_of(rows=None) -> dict:
    """Alpha's ids, or (without ``rows``) ids of the same kinds that name nothing."""
    if rows is None:
        return {"slug": "no-such-project", "sid": new_id(), "address": f"{new_id()}:{new_id()}",
                "name": "no-such-agent", "job": new_id()}
    return {"slug": "alpha", "sid": rows.sid, "address": rows.address, "name": rows.name, "job": rows.job_id}


def project_urls(v: dict) -> list[tuple[str, str, object]]:
    """(method, url, body) for the project's API routes."""
    return [
        ("GET", f"/api/projects/{v['slug']}", None),
        ("GET", f"/api/projects/{v['slug']}/limits", None),
        ("GET", f"/api/projects/{v['slug']}/members", None),
        ("POST", f"/api/projects/{v['slug']}/sessions", {"title": "x"}),
        ("GET", f"/api/sessions/{v['sid']}", None),
        ("GET", f"/api/sessions/{v['sid']}/branches", None),
        ("GET", f"/api/sessions/{v['sid']}/events", None),
        ("POST", f"/api/sessions/{v['sid']}/turns", {"prompt": "x"}),
        ("GET", f"/api/executions/{v['job']}", None),
        ("GET", f"/api/branches/{v['address']}/transcript", None),
        ("GET", f"/api/branches/{v['name']}/transcript", None),
        ("POST", f"/api/branches/{v['address']}/tools/list_agents", {"arguments": {}}),
    ]


def request(api, method, url, body):
    return api.get(url) if method == "GET" else api.post(url, body)


def assert_sees_nothing_of_alpha(api, client, rows) -> None:
    """Every route and page of alpha answers exactly as for a project that does not exist."""
    hidden, missing = values_of(rows), values_of()
    for (method, url, body), (_, missing_url, _) in zip(project_urls(hidden), project_urls(missing)):
        seen, unseen = request(api, method, url, body), request(api, method, missing_url, body)
        assert seen.status_code == 404, (url, seen.status_code, seen.content)
        assert masked(seen, hidden) == masked(unseen, missing), (url, seen.content, unseen.content)
        assert "alpha secret" not in seen.content.decode()
    assert "alpha" not in [p["slug"] for p in api.get("/api/projects").json()]
    for page in (reverse("collab:project", args=["alpha"]), reverse("collab:session", args=[rows.sid]),
                 reverse("collab:audit", args=["alpha"])):
        assert client.get(page).status_code == 404, page


# --- the invitee's side ----------------------------------------------------------------------------


def test_a_pending_invitee_gets_nothing_until_they_accept_then_everything_their_role_gives(
    team, api_as, make_user, alpha_rows
):
    """The owner invites ivy as a member. Until she accepts, every API route, page and
    name of alpha answers her exactly like a missing project (404 ``not_found``) and nothing is
    started; she sees the invitation (project, role, who invited her). The owner sees it as
    ``status: "pending"``. After she accepts she has a member's access. Both steps are audited."""
    owner = api_as(team.owner)
    ivy = make_user("ivy")
    ivy_api, ivy_client = api_as(ivy), logged_in(ivy)
    r = owner.post("/api/projects/alpha/members", {"username": "ivy", "role": "member"})
    assert r.status_code == 201, r.content
    assert {"username": "ivy", "role": "member", "status": "pending", "invited_by": "owner", "accepted_at": None}.items() <= r.json().items()
    members = {m["username"]: m for m in owner.get("/api/projects/alpha/members").json()}
    assert members["ivy"]["status"] == "pending"
    assert {m["status"] for name, m in members.items() if name != "ivy"} == {"active"}

    jobs, branches = Job.objects.count(), Branch.objects.count()
    assert_sees_nothing_of_alpha(ivy_api, ivy_client, alpha_rows)
    assert ivy_api.get("/api/projects").json() == []
    assert (Job.objects.count(), Branch.objects.count()) == (jobs, branches)
    invitation = invitation_of(ivy_api, "alpha")
    assert {"project": "alpha", "project_name": "Alpha", "role": "member", "status": "pending",
            "invited_by": "owner"}.items() <= invitation.items()
    page = ivy_client.get(reverse("collab:projects")).content.decode()
    assert reverse("collab:accept_invitation", args=[invitation["id"]]) in page
    assert reverse("collab:decline_invitation", args=[invitation["id"]]) in page
    assert reverse("collab:project", args=["alpha"]) not in page

    r = ivy_api.post(f"/api/invitations/{invitation['id']}/accept")
    assert r.status_code == 200 and r.json()["status"] == "active" and r.json()["accepted_at"], r.content
    assert [(p["slug"], p["role"]) for p in ivy_api.get("/api/projects").json()] == [("alpha", "member")]
    assert ivy_api.get(f"/api/sessions/{alpha_rows.sid}").status_code == 200
    assert ivy_api.get(f"/api/branches/{alpha_rows.name}/transcript").status_code == 200
    assert ivy_api.post(f"/api/sessions/{alpha_rows.sid}/turns", {"prompt": "hello"}).status_code == 202
    assert ivy_client.get(reverse("collab:project", args=["alpha"])).status_code == 200
    assert ivy_api.get("/api/invitations").json() == []
    assert {m["username"]: m["status"] for m in owner.get("/api/projects/alpha/members").json()}["ivy"] == "active"
    assert project_events("alpha") == [
        ("member.invited", "owner", {"username": "ivy", "role": "member"}),
        ("member.accepted", "ivy", {"username": "ivy", "role": "member"}),
    ]


def test_declined_and_cancelled_invitations_leave_no_access(team, api_as, make_user, alpha_rows):
    """Ivy declines (the invitation is gone, she has no access, accepting it later is
    "not found"); invited again, the owner cancels it with ``DELETE …/members/ivy`` (same). Each
    step is a project-level Event with its actor."""
    owner = api_as(team.owner)
    ivy = make_user("ivy")
    ivy_api = api_as(ivy)
    assert owner.post("/api/projects/alpha/members", {"username": "ivy", "role": "viewer"}).status_code == 201
    first = invitation_of(ivy_api, "alpha")
    assert ivy_api.post(f"/api/invitations/{first['id']}/decline").status_code == 204
    assert ivy_api.get("/api/invitations").json() == []
    assert "ivy" not in [m["username"] for m in owner.get("/api/projects/alpha/members").json()]
    r = ivy_api.post(f"/api/invitations/{first['id']}/accept")
    assert (r.status_code, r.json()["code"]) == (404, "not_found")
    assert_sees_nothing_of_alpha(ivy_api, logged_in(ivy), alpha_rows)

    assert owner.post("/api/projects/alpha/members", {"username": "ivy", "role": "member"}).status_code == 201
    second = invitation_of(ivy_api, "alpha")
    assert owner.delete("/api/projects/alpha/members/ivy").status_code == 204
    assert ivy_api.get("/api/invitations").json() == []
    r = ivy_api.post(f"/api/invitations/{second['id']}/accept")
    assert (r.status_code, r.json()["code"]) == (404, "not_found")
    assert_sees_nothing_of_alpha(ivy_api, logged_in(ivy), alpha_rows)
    assert not Membership.objects.filter(user=ivy).exists()
    assert project_events("alpha") == [
        ("member.invited", "owner", {"username": "ivy", "role": "viewer"}),
        ("member.declined", "ivy", {"username": "ivy", "role": "viewer"}),
        ("member.invited", "owner", {"username": "ivy", "role": "member"}),
        ("member.invitation_cancelled", "owner", {"username": "ivy"}),
    ]


def test_nobody_answers_someone_elses_invitation(team, api_as, make_user):
    """The invitation is ivy's alone. Beta's owner and alpha's own owner answering it
    get the 404 of an invitation that does not exist; it stays pending and gives nothing."""
    make_user("ivy")
    assert api_as(team.owner).post("/api/projects/alpha/members", {"username": "ivy", "role": "owner"}).status_code == 201
    invitation = Membership.objects.get(user__username="ivy")
    for person in (team.outsider, team.owner, team.member):
        api = api_as(person)
        for answer in ("accept", "decline"):
            seen = api.post(f"/api/invitations/{invitation.pk}/{answer}")
            unseen = api.post(f"/api/invitations/{invitation.pk + 1000}/{answer}")
            assert seen.status_code == 404 and masked(seen, {}) == masked(unseen, {}), (person, answer, seen.content)
            page = logged_in(person).post(reverse(f"collab:{answer}_invitation", args=[invitation.pk]))
            assert page.status_code == 404
    invitation.refresh_from_db()
    assert invitation.accepted_at is None
    assert [p["slug"] for p in api_as(invitation.user).get("/api/projects").json()] == []


def test_owners_manage_invitations_and_a_pending_owner_does_not_keep_the_project(team, api_as, make_user):
    """Inviting twice is 409 ``already_invited``, inviting a member 409 ``already_member``;
    an owner may change a pending invitation's role. A pending owner invitation is not an owner:
    the last owner cannot step down until it is accepted."""
    owner = api_as(team.owner)
    ivy_api = api_as(make_user("ivy"))
    assert owner.post("/api/projects/alpha/members", {"username": "ivy", "role": "viewer"}).status_code == 201
    r = owner.post("/api/projects/alpha/members", {"username": "ivy", "role": "viewer"})
    assert (r.status_code, r.json()["code"]) == (409, "already_invited")
    r = owner.post("/api/projects/alpha/members", {"username": "member", "role": "viewer"})
    assert (r.status_code, r.json()["code"]) == (409, "already_member")
    r = owner.patch("/api/projects/alpha/members/ivy", {"role": "owner"})
    assert r.status_code == 200 and (r.json()["role"], r.json()["status"]) == ("owner", "pending"), r.content

    r = owner.patch("/api/projects/alpha/members/owner", {"role": "member"})
    assert (r.status_code, r.json()["code"]) == (409, "last_owner")
    assert ivy_api.post(f"/api/invitations/{invitation_of(ivy_api, 'alpha')['id']}/accept").status_code == 200
    assert owner.patch("/api/projects/alpha/members/owner", {"role": "member"}).status_code == 200
    assert ivy_api.get("/api/projects/alpha/members").status_code == 200


# --- pages, sockets, admin ----------------------------------------------------------------------


def test_pages_invite_list_accept_decline_and_cancel(team, api_as, make_user):
    """On the project page an owner invites (the row shows "invitation pending" and a
    cancel button that cancels it); on the projects page the invitee sees each pending
    invitation with Accept (then lands in the project) and Decline buttons."""
    owner_page = logged_in(team.owner)
    ivy = make_user("ivy")
    r = owner_page.post(reverse("collab:project_members", args=["alpha"]), {"action": "add", "username": "ivy", "role": "member"})
    assert r.status_code == 302
    html = owner_page.get(reverse("collab:project", args=["alpha"])).content.decode()
    assert 'data-member="ivy" data-status="pending"' in html and "invitation pending" in html
    assert "cancel invitation" in html
    r = owner_page.post(reverse("collab:project_members", args=["alpha"]), {"action": "remove", "username": "ivy"})
    assert r.status_code == 302 and not Membership.objects.filter(user=ivy).exists()
    assert project_events("alpha")[-1] == ("member.invitation_cancelled", "owner", {"username": "ivy"})

    assert owner_page.post(reverse("collab:project_members", args=["alpha"]),
                           {"action": "add", "username": "ivy", "role": "viewer"}).status_code == 302
    assert api_as(team.outsider).post("/api/projects/beta/members", {"username": "ivy", "role": "member"}).status_code == 201
    ivy_page = logged_in(ivy)
    html = ivy_page.get(reverse("collab:projects")).content.decode()
    assert "Invitations" in html and "Alpha" in html and "Beta" in html and "invited by owner" in html
    alpha_inv, beta_inv = (Membership.objects.get(user=ivy, project__slug=s) for s in ("alpha", "beta"))
    r = ivy_page.post(reverse("collab:accept_invitation", args=[alpha_inv.pk]))
    assert r.status_code == 302 and r["Location"] == reverse("collab:project", args=["alpha"])
    assert ivy_page.get(r["Location"]).status_code == 200
    r = ivy_page.post(reverse("collab:decline_invitation", args=[beta_inv.pk]))
    assert r.status_code == 302 and r["Location"] == reverse("collab:projects")
    html = ivy_page.get(reverse("collab:projects")).content.decode()
    assert "Invitations" not in html and reverse("collab:project", args=["alpha"]) in html
    assert ivy_page.get(reverse("collab:project", args=["beta"])).status_code == 404
    assert project_events("beta") == [("member.invited", "outsider", {"username": "ivy", "role": "member"}),
                                      ("member.declined", "ivy", {"username": "ivy", "role": "member"})]


def socket_handshake(sid: str, token: str):
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    async def body():
        comm = WebsocketCommunicator(application, f"/ws/sessions/{sid}/",
                                     headers=[ORIGIN, (b"authorization", f"Bearer {token}".encode())])
        connected, code = await comm.connect(timeout=15)
        if connected:
            await comm.disconnect()
        return connected, code

    return async_to_sync(body)()


def test_a_pending_invitee_cannot_open_the_sessions_socket(transactional_db, team, api_as, make_user, alpha_rows):
    """The WebSocket of an alpha session refuses a pending invitee exactly
    as for a session that does not exist, and accepts her once she has accepted."""
    from accounts.models import ApiToken

    ivy = make_user("ivy")
    _, token = ApiToken.issue(ivy)
    assert api_as(team.owner).post("/api/projects/alpha/members", {"username": "ivy", "role": "viewer"}).status_code == 201
    pending, missing = socket_handshake(alpha_rows.sid, token), socket_handshake(new_id(), token)
    assert pending == missing and pending[0] is False
    ivy_api = api_as(ivy)
    assert ivy_api.post(f"/api/invitations/{invitation_of(ivy_api, 'alpha')['id']}/accept").status_code == 200
    assert socket_handshake(alpha_rows.sid, token)[0] is True


def test_the_admin_adds_a_pending_invitation(team, make_user, django_user_model):
    """An operator adding a membership in the admin creates an invitation (pending,
    invited by the operator), which gives the person nothing until accepted."""
    operator = django_user_model.objects.create_superuser("operator", "op@example.com", "pw-secret-123")
    ivy = make_user("ivy")
    r = logged_in(operator).post(reverse("admin:accounts_membership_add"),
                                 {"user": ivy.pk, "project": team.alpha.pk, "role": "member", "created_at_0": "2026-01-01",
                                  "created_at_1": "00:00:00"})
    assert r.status_code == 302, r.content.decode()[:2000]
    row = Membership.objects.get(user=ivy)
    assert (row.accepted_at, row.invited_by) == (None, operator)
    assert logged_in(ivy).get(reverse("collab:project", args=["alpha"])).status_code == 404


# --- who is accepted from the start -------------------------------------------------------------


def test_a_new_projects_creator_and_the_demo_are_active_members(team, api_as, settings, tmp_path):
    """Creating a project makes the creator an active owner at once; ``manage.py demo``
    makes an active membership."""
    api = api_as(team.member)
    assert api.post("/api/projects", {"slug": "gamma", "name": "Gamma"}).status_code == 201
    (row,) = api.get("/api/projects/gamma/members").json()
    assert (row["username"], row["role"], row["status"]) == ("member", "owner", "active")
    settings.VAR_DIR = tmp_path
    call_command("demo", "--quiet", stdout=StringIO())
    assert Membership.objects.get(project__slug="demo").accepted_at is not None


@pytest.mark.one_database("sqlite")  # the data migration's Python; every migration runs on both at set-up
def test_the_migration_keeps_existing_members_active(transactional_db, team):
    """``accounts/0003_membership_invitation`` turns every membership that existed
    before it into an accepted one (nobody loses access in the upgrade)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("accounts", "0002_project_last_event_seq"), ("accounts", "0003_membership_invitation")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    user = old.get_model("auth", "User").objects.create(username="old-timer")
    old.get_model("accounts", "Membership").objects.create(user=user, project_id=team.alpha.pk, role="member")
    try:
        executor = MigrationExecutor(connection)
        executor.migrate([after])
        executor.loader.build_graph()
        row = Membership.objects.get(user__username="old-timer")
        assert row.accepted_at is not None and row.invited_by is None
        assert Project.objects.filter(pk=team.alpha.pk, memberships__user__username="old-timer").exists()
        assert Membership.objects.filter(accepted_at__isnull=True).count() == 0
    finally:
        # back to the newest schema: the tests after this one share the database
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


# --- one door ----------------------------------------------------------------------------------------


def test_every_membership_lookup_goes_through_the_policy():
    """Access is decided in one place. Outside ``accounts`` no code joins ``memberships``
    by hand or filters ``Membership.objects`` for access (either would count pending
    invitations); they use ``accounts.policy.member_project_ids`` / ``member_roles`` /
    ``role_of``. Listing pending invitations and creating trusted rows are the named exceptions."""
    allowed = {
        "collab/selectors/members.py",  # members_of / invitations_of list pending rows on purpose
        "collab/management/commands/demo.py",  # creates the demo owner (accepted)
    }
    offenders = []
    for path in sorted((ROOT / "collab").rglob("*.py")) + sorted((ROOT / "config").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "/migrations/" in rel or rel in allowed:
            continue
        text = path.read_text()
        for needle in ("memberships__", "Membership.objects", ".memberships."):
            if needle in text:
                offenders.append(f"{rel}: {needle}")
    assert offenders == [], offenders
    # and the policy itself counts accepted rows only
    policy = (ROOT / "accounts" / "policy.py").read_text()
    assert "Membership.objects.accepted()" in policy and "memberships__" not in policy
