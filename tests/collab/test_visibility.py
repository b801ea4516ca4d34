"""Row-level visibility: private and shared sessions inside a project (docs/contract.md#visibility).

The cross-tenant authorization matrix of ``test_authorization`` grows a dimension: alpha's
session (and its OpenWork session, whose sub-agent follows it) is made ``shared`` by its
creator with one colleague (``friend``); another member of the same project (``colleague``)
then calls every API route, page and collab tool with its rows and gets exactly the answer
for rows that do not exist — and for another project's rows — while the creator, the listed
member and a maintainer keep their access. Then: who sees what by visibility, the effective
role of a share, who may change it (page, API, admin — each change an Event), sub-agents and
attach cards, sockets closed on a real daphne when access goes, a real worker turn of a
non-listed member's agent, and constant query counts as sessions grow.
"""

import asyncio
import json
import urllib.request
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import Membership
from collab.models import Event, Session, SessionShare
from collab.models.ids import new_id
from tests.collab.test_authorization import (  # noqa: F401  (alpha, alpha_world, beta, team: fixtures)
    COLLAB_PROBES,
    NOT_FOUND_CODES,
    ORIGIN,
    PAGE_PATTERNS,
    PAGE_ROW_PARAMS,
    PAGES,
    PASSWORD,
    ROUTES,
    SECRET_BITS,
    alpha,
    alpha_world,
    api_probe,
    auth_header,
    bearer_token,
    beta,
    call_api,
    handshake,
    logged_in,
    masked,
    row_counts,
    run_gateway,
    team,
    tool_targets,
    value_sets,
)

# Parameters that name a row hanging off a session (the dimension this file adds).
SESSION_PARAMS = {"sid", "session", "execution_id", "job_id", "address", "mid", "artifact_id", "hold_id"}


def param_names(operation) -> set[str]:
    return {p["name"] for p in operation.get("parameters", [])}


SESSION_ROUTES = [r for r in ROUTES if param_names(r[2]) & SESSION_PARAMS]
SESSION_PAGES = [(n, p) for n, p in PAGE_PATTERNS if set(p) & SESSION_PARAMS]


def join(project, user, role):
    Membership.objects.create(user=user, project=project, role=role)
    return user


@pytest.fixture
def hidden(team, alpha, make_user, api_as):
    """alpha's session and its OpenWork session, ``shared`` by their creator (``member``) with
    ``friend`` (a member, shared as member); ``colleague`` is a member nobody listed."""
    friend = join(team.alpha, make_user("friend"), "member")
    colleague = join(team.alpha, make_user("colleague"), "member")
    creator = api_as(team.member)
    ow_root = Session.objects.get(task_name="alpha_secret_child").parent_session_id
    for sid in (alpha.sid, ow_root):
        r = creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"})
        assert r.status_code == 200 and r.json()["visibility"] == "shared", r.content
        r = creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"})
        assert r.status_code == 201, r.content
    return SimpleNamespace(friend=friend, colleague=colleague, ow_root=ow_root,
                           child=Session.objects.get(task_name="alpha_secret_child").pk)


def other_project(values: dict, beta_rows) -> dict:
    """The same request aimed at beta's session instead (where the value is a session id)."""
    return {n: (beta_rows.sid if n in ("sid", "session") else v) for n, v in values.items()}


@pytest.mark.parametrize("method,path,operation", SESSION_ROUTES, ids=[f"{m} {p}" for m, p, _ in SESSION_ROUTES])
def test_every_api_route_answers_a_non_listed_member_like_a_missing_row(team, alpha, beta, hidden, method, path,
                                                                              operation):
    """A member of alpha not listed on a shared session calls every API route
    that names a session's row: 404, the same body as for missing rows and as for beta's session,
    nothing written, no title or preview. The creator, the listed member and a maintainer keep
    their access (every method for the maintainer, reads for all three)."""
    probe = api_probe(method, path, operation, alpha)
    names = probe.path_params + probe.query_params
    token = bearer_token(hidden.colleague)
    for values, missing_variants, mask in value_sets(f"{method} {path}", names, alpha):
        before = row_counts()
        seen = call_api(token, method, probe.url(values), probe.body)
        assert seen.status_code == 404, (probe.url(values), seen.status_code, seen.content)
        for missing in missing_variants:
            assert masked(seen, mask) == masked(call_api(token, method, probe.url(missing), probe.body), mask)
        if set(names) & {"sid", "session"} and set(names) <= {"sid", "session", "tool", "username"}:
            elsewhere = other_project(values, beta)
            assert masked(seen, {**mask, beta.sid: "sid" if "sid" in names else "session"}) == masked(
                call_api(token, method, probe.url(elsewhere), probe.body), {**mask, beta.sid: "sid" if "sid" in names else "session"})
        assert row_counts() == before, f"{method} {path} wrote rows for a non-listed member"
        for bit in SECRET_BITS:
            assert bit not in masked(seen, mask)[2]

    values = next(value_sets(method, names, alpha))[0]
    keepers = ("member", "friend", "maintainer") if method == "GET" else ("maintainer",)
    for who in keepers:
        user = hidden.friend if who == "friend" else getattr(team, who)
        ok = call_api(bearer_token(user), method, probe.url(values), probe.body)
        assert 200 <= ok.status_code < 300, (who, method, probe.url(values), ok.status_code, ok.content)


@pytest.mark.parametrize("name,params", SESSION_PAGES, ids=[n for n, _ in SESSION_PAGES])
def test_every_session_page_answers_a_non_listed_member_like_a_missing_row(team, alpha, hidden, name, params):
    """Every page that names a session's row answers the non-listed member
    exactly as for missing rows (404, same body); the creator, the listed member and a
    maintainer open the GET pages, and the maintainer uses the POST ones."""
    accepted, data = PAGES[name]
    data = data(alpha) if data else {}
    colleague = logged_in(hidden.colleague)

    def fetch(client, method, values):
        url = reverse(f"collab:{name}", kwargs=values)
        return client.get(url) if method == "GET" else client.post(url, data)

    for values, missing_variants, mask in value_sets(f"page {name}", params, alpha, PAGE_ROW_PARAMS.get(name)):
        before = row_counts()
        seen = fetch(colleague, accepted, values)
        assert seen.status_code == 404, (name, seen.status_code)
        for missing in missing_variants:
            assert masked(seen, mask) == masked(fetch(colleague, accepted, missing), mask), (name, missing)
        assert row_counts() == before
        for bit in SECRET_BITS:
            assert bit not in masked(seen, mask)[2]
    values = next(value_sets(name, params, alpha, PAGE_ROW_PARAMS.get(name)))[0]
    keepers = ("member", "friend", "maintainer") if accepted == "GET" else ("maintainer",)
    for who in keepers:
        user = hidden.friend if who == "friend" else getattr(team, who)
        ok = fetch(logged_in(user), accepted, values)
        assert ok.status_code < 400, (who, name, ok.status_code)


@pytest.fixture
def colleague_branch(team, hidden, api_as, scripted_session):
    """The colleague's own (project-wide) session in alpha, with one node: its address."""
    api, sid = scripted_session(hidden.colleague, [{"text": "colleague answer"}], agent_id="colleague-bot")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "colleague prompt"}).status_code == 202
    return f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"


@pytest.mark.parametrize("tool", sorted(t for t, probes in COLLAB_PROBES.items() if probes))
def test_every_tool_answers_a_non_listed_members_agent_like_about_nothing(team, alpha, hidden, colleague_branch, tool):
    """The colleague's agent (a branch of their own session in the same project)
    names the shared session's addresses, names, ids and jobs through the gateway: every answer
    is the answer for a target that does not exist, and nothing is written."""
    token = bearer_token(hidden.colleague)
    own_todo = run_gateway(token, colleague_branch, "todo_create", {"subject": "mine"}).json()["details"]["todo_id"]
    seen_t, missing_t = tool_targets(alpha, False), tool_targets(alpha, True)
    seen_t["own_todo_id"] = missing_t["own_todo_id"] = own_todo
    mask = {str(seen_t[k]): k for k in seen_t if k != "own_todo_id"} | {str(missing_t[k]): k for k in missing_t if k != "own_todo_id"}
    for label, build in COLLAB_PROBES[tool].items():
        before = row_counts()
        seen = run_gateway(token, colleague_branch, tool, build(seen_t))
        body = seen.json()
        assert body["is_error"], (tool, label, body)
        assert "not found" in body["text"].lower() or body["details"].get("code") in NOT_FOUND_CODES, body
        assert masked(seen, mask) == masked(run_gateway(token, colleague_branch, tool, build(missing_t)), mask), (tool, label)
        assert row_counts() == before
        for bit in SECRET_BITS:
            assert bit not in masked(seen, mask)[2]


def test_listings_leave_a_hidden_session_out_and_list_it_for_those_who_see_it(team, alpha, api_as, make_user,
                                                                                     scripted_session):
    """``list_agents(scope="all")``, ``list_jobs`` and the project page of a
    non-listed member show nothing of a private session (no title, id or count), before and
    after it existed being indistinguishable; the creator's own listing has it."""
    colleague = join(team.alpha, make_user("colleague"), "member")
    api, sid = scripted_session(colleague, [{"text": "x"}], agent_id="colleague-bot")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "p"}).status_code == 202
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"
    token = bearer_token(colleague)
    page = logged_in(colleague)

    def views():
        listing = run_gateway(token, address, "list_agents", {"scope": "all"}).json()
        body = page.get(reverse("collab:project", args=["alpha"])).content.decode()
        return listing, body

    listing_before, page_before = views()
    assert alpha.sid in json.dumps(listing_before) and alpha.sid in page_before
    assert api_as(team.member).patch(f"/api/sessions/{alpha.sid}", {"visibility": "private"}).status_code == 200
    listing, body = views()
    assert alpha.sid not in json.dumps(listing) and alpha.sid not in body
    assert 'id="session-count">' in body
    count = lambda html: int(html.split('id="session-count">')[1].split("<")[0])  # noqa: E731
    assert count(body) == count(page_before) - 1
    search = page.get(reverse("collab:project", args=["alpha"]), {"q": alpha.sid}).content.decode()
    assert f'data-session="{alpha.sid}"' not in search and f"title or id matched “{alpha.sid}”" in search
    for bit in SECRET_BITS[:3]:
        assert bit not in json.dumps(listing)
    # the creator and a maintainer still list it
    mine = logged_in(team.member).get(reverse("collab:project", args=["alpha"]), {"q": alpha.sid}).content.decode()
    assert f'data-session="{alpha.sid}"' in mine
    assert alpha.sid in logged_in(team.maintainer).get(reverse("collab:project", args=["alpha"])).content.decode()


# --- who sees what, and with which role ----------------------------------------------------


@pytest.mark.parametrize("visibility,sees", [
    ("project", {"owner", "maintainer", "member", "viewer", "friend", "colleague"}),
    ("private", {"owner", "maintainer", "member"}),
    ("shared", {"owner", "maintainer", "member", "friend"}),
])
def test_who_sees_a_session_by_visibility(team, api_as, make_user, scripted_session, visibility, sees):
    """Project — every member; private — its creator, maintainers and owners; shared —
    its creator, the listed members, maintainers and owners. Everyone else (and another
    project's owner) gets the 404 of a missing session. ``SessionOut`` says which."""
    friend = join(team.alpha, make_user("friend"), "member")
    colleague = join(team.alpha, make_user("colleague"), "member")
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": visibility}).status_code == 200
    r = call_api(bearer_token(team.member), "PUT", f"/api/sessions/{sid}/shares", [{"username": "friend", "role": "viewer"}])
    assert r.status_code == 200, r.content
    people = {"owner": team.owner, "maintainer": team.maintainer, "member": team.member, "viewer": team.viewer,
              "friend": friend, "colleague": colleague, "outsider": team.outsider}
    missing = new_id()
    for name, user in people.items():
        api = api_as(user)
        got = api.get(f"/api/sessions/{sid}")
        if name in sees:
            assert got.status_code == 200 and got.json()["visibility"] == visibility, (name, got.content)
        else:
            gone = api.get(f"/api/sessions/{missing}")
            assert (got.status_code, got.content.replace(sid.encode(), b"X")) == (
                gone.status_code, gone.content.replace(missing.encode(), b"X")), name


def test_a_share_gives_the_lesser_of_its_role_and_the_project_role(team, api_as, make_user, scripted_session):
    """A member shared as viewer reads but cannot start turns; shared as member, they
    can; a share wider than the project role is refused; only project members can be listed."""
    friend = join(team.alpha, make_user("friend"), "member")
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"}).status_code == 200
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "viewer"}).status_code == 201
    friend_api = api_as(friend)
    assert friend_api.get(f"/api/sessions/{sid}").status_code == 200
    refused = friend_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
    assert refused.status_code == 403, refused.content
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"}).status_code == 201
    assert friend_api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    too_wide = creator.post(f"/api/sessions/{sid}/shares", {"username": "viewer", "role": "member"})
    assert too_wide.status_code == 400 and too_wide.json()["code"] == "share_role_too_wide"
    stranger = creator.post(f"/api/sessions/{sid}/shares", {"username": "outsider", "role": "viewer"})
    assert stranger.status_code == 404 and stranger.json()["code"] == "not_member"
    bad = creator.patch(f"/api/sessions/{sid}", {"visibility": "secret"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_visibility"
    assert [s["username"] for s in creator.get(f"/api/sessions/{sid}/shares").json()] == ["friend"]


def test_only_the_creator_or_a_maintainer_changes_it_and_each_change_is_an_event(team, api_as, make_user,
                                                                                         scripted_session):
    """A listed member or another member may not change who sees a session (403 when they
    see it, 404 when they do not); the creator and a maintainer may, from the API and the page;
    each change is an audited Event, and unsharing deletes nothing of the session."""
    friend = join(team.alpha, make_user("friend"), "member")
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"}).status_code == 200
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"}).status_code == 201
    assert api_as(friend).patch(f"/api/sessions/{sid}", {"visibility": "project"}).status_code == 403
    assert api_as(team.viewer).patch(f"/api/sessions/{sid}", {"visibility": "project"}).status_code == 404
    assert api_as(team.maintainer).delete(f"/api/sessions/{sid}/shares/friend").status_code == 204
    assert api_as(friend).get(f"/api/sessions/{sid}").status_code == 404
    page = logged_in(team.member)
    r = page.post(reverse("collab:session_visibility", args=[sid]), {"visibility": "private", "shares": "friend viewer\n"})
    assert r.status_code == 302
    assert Session.objects.get(pk=sid).visibility == "private"
    assert SessionShare.objects.filter(session_id=sid, user=friend, role="viewer").exists()
    assert api_as(friend).get(f"/api/sessions/{sid}").status_code == 404  # the share counts only while shared
    shown = page.get(reverse("collab:session", args=[sid])).content.decode()
    assert 'data-visibility="private"' in shown and 'name="shares"' in shown
    events = list(Event.objects.filter(session_id=sid, type__startswith="session.").exclude(type="session.created")
                  .order_by("seq").values_list("type", "actor__username", "payload"))
    assert events == [
        ("session.visibility_changed", "member", {"session": sid, "from": "project", "to": "shared"}),
        ("session.shared", "member", {"username": "friend", "role": "member"}),
        ("session.unshared", "maintainer", {"username": "friend"}),
        ("session.visibility_changed", "member", {"session": sid, "from": "shared", "to": "private"}),
        ("session.shared", "member", {"username": "friend", "role": "viewer"}),
    ]
    assert Session.objects.filter(pk=sid).exists()


def test_the_admin_changes_visibility_through_the_same_service(team, scripted_session, django_user_model):
    """An operator's admin action makes a session private and shares it, writing the
    same Events; a refused share (not a member) changes nothing."""
    root = django_user_model.objects.create_superuser("root", "root@example.invalid", PASSWORD)
    admin = logged_in(root)
    _, sid = scripted_session(team.member, [{"text": "x"}])
    url = reverse("admin:collab_session_changelist")
    r = admin.post(url, {"action": "make_private", "_selected_action": [sid]})
    assert r.status_code == 302
    assert Session.objects.get(pk=sid).visibility == "private"
    r = admin.post(url, {"action": "share_with", "_selected_action": [sid], "username": "outsider", "role": "viewer"})
    assert r.status_code == 302 and not SessionShare.objects.filter(session_id=sid).exists()
    r = admin.post(url, {"action": "share_with", "_selected_action": [sid], "username": "viewer", "role": "viewer"})
    assert SessionShare.objects.filter(session_id=sid, user=team.viewer).exists()
    types = list(Event.objects.filter(session_id=sid, actor=root).order_by("seq").values_list("type", flat=True))
    assert types == ["session.visibility_changed", "session.shared"]


def test_a_sub_agent_session_follows_its_root(team, alpha, hidden, api_as):
    """The OpenWork child of a shared session is hidden from the non-listed member like a
    missing session, readable by the listed member, says its root's visibility, and cannot be
    given a visibility of its own."""
    missing = new_id()
    colleague = api_as(hidden.colleague)
    seen, gone = colleague.get(f"/api/sessions/{hidden.child}"), colleague.get(f"/api/sessions/{missing}")
    assert (seen.status_code, seen.content.replace(hidden.child.encode(), b"X")) == (
        gone.status_code, gone.content.replace(missing.encode(), b"X"))
    got = api_as(hidden.friend).get(f"/api/sessions/{hidden.child}")
    assert got.status_code == 200 and got.json()["visibility"] == "shared"
    r = api_as(team.member).patch(f"/api/sessions/{hidden.child}", {"visibility": "project"})
    assert r.status_code == 400 and r.json()["code"] == "child_session_visibility"
    assert hidden.child not in logged_in(hidden.colleague).get(reverse("collab:project", args=["alpha"])).content.decode()


def test_attach_cards_name_no_session_the_viewer_cannot_see(team, api_as, make_user, scripted_session):
    """An agent of a project-wide session forks into its creator's private session; the
    attach card on the project-wide session is shown to the creator and left out for a member
    who cannot see the private one (no id, no name)."""
    colleague = join(team.alpha, make_user("colleague"), "member")
    creator, open_sid = scripted_session(team.member, [{"text": "x"}])
    private_sid = creator.post("/api/projects/alpha/sessions", {"title": "mine", "agent_id": "bot"}).json()["id"]
    for sid in (open_sid, private_sid):
        assert creator.post(f"/api/sessions/{sid}/turns", {"prompt": "p"}).status_code == 202
    assert creator.patch(f"/api/sessions/{private_sid}", {"visibility": "private"}).status_code == 200
    open_addr = f"{open_sid}:{creator.get(f'/api/sessions/{open_sid}').json()['head']}"
    private_head = creator.get(f"/api/sessions/{private_sid}").json()["head"]
    r = creator.post(f"/api/branches/{open_addr}/tools/agent", {"arguments": {
        "prompt": "continue there", "description": "secret-fork", "start_from": f"{private_sid}:{private_head}",
        "run_in_background": True}})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    url = reverse("collab:session", args=[open_sid])
    mine = logged_in(team.member).get(url).content.decode()
    colleague_page = logged_in(colleague).get(url)
    assert colleague_page.status_code == 200
    body = colleague_page.content.decode()
    assert "data-attach" in mine and private_sid in mine
    assert "data-attach" not in body and private_sid not in body and "secret-fork" not in body


def test_unsharing_refuses_the_next_gateway_call_of_the_person_who_lost_access(team, api_as, make_user,
                                                                                      scripted_session):
    """The listed member works in a shared session through the gateway; once unshared,
    their next call there is "not found", like a missing branch."""
    friend = join(team.alpha, make_user("friend"), "member")
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"}).status_code == 200
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"}).status_code == 201
    friend_api = api_as(friend)
    assert creator.post(f"/api/sessions/{sid}/turns", {"prompt": "first"}).status_code == 202
    main_head = creator.get(f"/api/sessions/{sid}").json()["head"]
    # the friend forks their own branch from the page (members act through the gateway as branches they started)
    forked = logged_in(friend).post(reverse("collab:fork", args=[sid, main_head]), {"prompt": "mine"})
    assert forked.status_code == 302, forked.content
    from collab.models import Branch

    head = Branch.objects.get(session_id=sid, created_by=friend).tip_id
    ok = friend_api.post(f"/api/branches/{sid}:{head}/tools/todo_list", {"arguments": {}})
    assert ok.status_code == 200 and not ok.json()["is_error"]
    assert creator.delete(f"/api/sessions/{sid}/shares/friend").status_code == 204
    seen = friend_api.post(f"/api/branches/{sid}:{head}/tools/todo_list", {"arguments": {}})
    missing = friend_api.post(f"/api/branches/{sid}:{new_id()}/tools/todo_list", {"arguments": {}})
    assert seen.status_code == missing.status_code == 404


# --- sockets --------------------------------------------------------------------------------


def test_the_socket_refuses_a_non_listed_member_like_a_missing_session(transactional_db, team, make_user,
                                                                              scripted_session):
    """The WebSocket handshake of a non-listed member for a private session is refused
    exactly as for a missing one; the creator and a maintainer are accepted."""
    colleague = join(team.alpha, make_user("colleague"), "member")
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "private"}).status_code == 200
    headers = {name: [ORIGIN, auth_header(bearer_token(user))]
               for name, user in (("colleague", colleague), ("member", team.member), ("maintainer", team.maintainer))}

    async def body():
        return (await handshake(sid, headers["colleague"]), await handshake(new_id(), headers["colleague"]),
                await handshake(sid, headers["member"]), await handshake(sid, headers["maintainer"]))

    seen, missing, creator_ok, maintainer_ok = async_to_sync(body)()
    assert seen == missing and seen[0] is False
    assert creator_ok[0] is True and maintainer_ok[0] is True


@pytest.mark.slow
def test_making_a_session_private_closes_the_socket_of_who_lost_access(team, make_user, scripted_session, server):
    """On a real daphne, a member follows a project-wide session; its creator
    makes it private through the server's API; the member's socket is closed (4403) while the
    creator's own socket stays open and receives the ``session.visibility_changed`` event."""
    from tests.collab.test_live_events import WsClient, ws_url

    colleague = join(team.alpha, make_user("colleague"), "member")
    _, sid = scripted_session(team.member, [{"text": "x"}])
    creator_token, colleague_token = bearer_token(team.member), bearer_token(colleague)  # not on the loop below

    def patch_private():
        request = urllib.request.Request(
            f"{server.url}/api/sessions/{sid}", method="PATCH", data=json.dumps({"visibility": "private"}).encode(),
            headers={"Authorization": f"Bearer {creator_token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status

    async def closed_code(client) -> int:
        while True:
            fin, opcode, payload = await asyncio.wait_for(client._frame(), 30)
            if opcode == 0x8:
                return int.from_bytes(payload[:2], "big")

    async def body():
        theirs = await WsClient.connect(ws_url(server, sid, 0), {"Authorization": f"Bearer {colleague_token}"},
                                        server.url)
        mine = await WsClient.connect(ws_url(server, sid, 0), {"Authorization": f"Bearer {creator_token}"}, server.url)
        await theirs.frames_until("session.created")
        await mine.frames_until("session.created")
        status = await asyncio.get_running_loop().run_in_executor(None, patch_private)
        code = await closed_code(theirs)
        frames = await mine.frames_until("session.visibility_changed")
        await mine.close()
        theirs.writer.close()
        return status, code, frames

    status, code, frames = async_to_sync(body)()
    assert status == 200
    assert code == 4403
    assert frames[-1]["payload"]["to"] == "private"


# --- a real worker turn ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_worker_turn_of_a_non_listed_member_reaches_nothing_of_a_private_session(
        team, api_as, make_user, scripted_session, worker):
    """A non-listed member's agent, in a real turn run by the worker, lists all
    agents, reads, forks from, delegates and sends to a private session of the same project, and
    asks for its job: "not found" everywhere, and the private session receives nothing."""
    colleague = join(team.alpha, make_user("colleague"), "member")
    creator, sid = scripted_session(team.member, [{"text": "private answer"}], agent_id="private-bot")
    turn = creator.post(f"/api/sessions/{sid}/turns", {"prompt": "private prompt"}).json()
    assert creator.wait(turn["execution_id"], timeout=60)["status"] == "succeeded"
    head = creator.get(f"/api/sessions/{sid}").json()["head"]
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "private"}).status_code == 200
    private_jobs = Session.objects.get(pk=sid).jobs.count()
    calls = [
        {"name": "list_agents", "arguments": {"scope": "all"}},
        {"name": "read_conversation", "arguments": {"session_id": sid}},
        {"name": "read_conversation", "arguments": {"session_id": f"{sid}:{head}"}},
        {"name": "agent", "arguments": {"prompt": "fork", "start_from": f"{sid}:{head}", "run_in_background": True}},
        {"name": "agent", "arguments": {"prompt": "do it", "to": f"{sid}:{head}"}},
        {"name": "send_message", "arguments": {"to": f"{sid}:{head}", "message": "hi"}},
        {"name": "job_output", "arguments": {"job_id": turn["execution_id"], "block": False}},
    ]
    api, own = scripted_session(colleague, {"user": [{"tool_calls": calls}, {"text": "done"}]}, agent_id="nosy-bot")
    r = api.post(f"/api/sessions/{own}/turns", {"prompt": "look around"})
    done = api.wait(r.json()["execution_id"], timeout=90)
    assert done["status"] == "succeeded", done
    from collab.models import Message

    results = list(Message.objects.filter(job_id=done["id"], role="tool").order_by("depth"))
    assert [m.metadata["tool"] for m in results] == [c["name"] for c in calls]
    codes = [m.metadata["details"].get("code") if m.metadata["is_error"] else None for m in results]
    assert codes == [None, "not_found", "not_found", "not_found", "not_found", "not_found", "not_found"], codes
    assert sid not in results[0].text and "private" not in results[0].text
    assert Session.objects.get(pk=sid).jobs.count() == private_jobs


# --- cheap queries --------------------------------------------------------------------------


def add_sessions(team, n: int) -> None:
    """n sessions per kind: project-wide, private (the member's), shared with the colleague, and
    each with a sub-agent session, plus an event each (rows written directly: only the reads count)."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from collab.events import send_event_on_commit

    earlier = timezone.now() - timedelta(days=1)  # the colleague's own session stays the most recent

    colleague = Membership.objects.get(project=team.alpha, user__username="colleague").user
    for i in range(n):
        for visibility in ("project", "private", "shared"):
            with transaction.atomic():
                s = Session.objects.create(project=team.alpha, title=f"{visibility}-{i}", created_by=team.member,
                                           visibility=visibility, last_active_at=earlier)
                if visibility == "shared":
                    SessionShare.objects.create(session=s, user=colleague, role="viewer")
                Session.objects.create(project=team.alpha, title=f"child-{visibility}-{i}", created_by=team.member,
                                       parent_session=s, agent_role="explorer", last_active_at=earlier)
                send_event_on_commit(s.pk, "session.created", {"session": s.pk}, actor=team.member)


def test_the_project_page_list_agents_and_the_audit_view_cost_the_same_as_sessions_grow(
        team, make_user, scripted_session, api_as):
    """Queries stay cheap: the project page (as a member), ``list_agents(scope="all")``
    (as a member's agent) and the audit view (as a maintainer) filter visible sessions in the
    query: the same number of queries with 3 or 12 sessions of each visibility."""
    colleague = join(team.alpha, make_user("colleague"), "member")
    api, sid = scripted_session(colleague, [{"text": "x"}], agent_id="colleague-bot")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "p"}).status_code == 202
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"
    token = bearer_token(colleague)
    page, audit = logged_in(colleague), logged_in(team.maintainer)

    def counts():
        out = {}
        for name, fetch in (
            ("project page", lambda: page.get(reverse("collab:project", args=["alpha"]))),
            ("list_agents", lambda: run_gateway(token, address, "list_agents", {"scope": "all"})),
            ("audit", lambda: audit.get(reverse("collab:audit", args=["alpha"]))),
            ("audit export", lambda: b"".join(audit.get(reverse("collab:audit", args=["alpha"]), {"format": "jsonl"}).streaming_content)),
        ):
            with CaptureQueriesContext(connection) as queries:
                result = fetch()
            assert getattr(result, "status_code", 200) == 200
            # a token records its use at most once a minute: that write is not a read of sessions
            out[name] = sum(1 for q in queries.captured_queries if 'UPDATE "accounts_apitoken"' not in q["sql"])
        return out

    add_sessions(team, 3)
    counts()  # warm: a token's first use of the minute records it
    few = counts()
    add_sessions(team, 9)
    many = counts()
    assert many == few
    body = page.get(reverse("collab:project", args=["alpha"])).content.decode()
    assert "shared-0" in body and "private-0" not in body and "project-0" in body


def test_an_agent_delivers_into_a_shared_session_only_with_the_shares_role(team, api_as, make_user,
                                                                                  scripted_session):
    """The friend's own agent may read a session shared with them as viewer, but not
    deliver into it (the share narrows their member role there); shared as member, it may."""
    friend = join(team.alpha, make_user("friend"), "member")
    creator, sid = scripted_session(team.member, [{"text": "x"}])
    assert creator.post(f"/api/sessions/{sid}/turns", {"prompt": "first"}).status_code == 202
    head = creator.get(f"/api/sessions/{sid}").json()["head"]
    assert creator.patch(f"/api/sessions/{sid}", {"visibility": "shared"}).status_code == 200
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "viewer"}).status_code == 201
    friend_api, own = scripted_session(friend, [{"text": "y"}], agent_id="friend-bot")
    assert friend_api.post(f"/api/sessions/{own}/turns", {"prompt": "mine"}).status_code == 202
    mine = f"{own}:{friend_api.get(f'/api/sessions/{own}').json()['head']}"
    token = bearer_token(friend)
    read = run_gateway(token, mine, "read_conversation", {"session_id": sid}).json()
    assert not read["is_error"], read
    sent = run_gateway(token, mine, "send_message", {"to": f"{sid}:{head}", "message": "hi"}).json()
    assert sent["is_error"] and "viewer" in sent["text"], sent
    assert creator.post(f"/api/sessions/{sid}/shares", {"username": "friend", "role": "member"}).status_code == 201
    sent = run_gateway(token, mine, "send_message", {"to": f"{sid}:{head}", "message": "hi"}).json()
    assert not sent["is_error"], sent
