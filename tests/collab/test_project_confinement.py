"""Agents stay in their project (docs/contract.md#addresses).

Two people, two projects, every membership combination between them — none, a pending
invitation, an accepted invitation, one way and both ways — and a person who belongs to
both projects and starts turns in each. Whatever the person who started a turn may see,
an agent's tools find nothing of the other project: names and ``SID:HEAD`` for
``agent(to=…)`` and ``send_message``, ``list_agents`` in every scope, ``read_conversation``,
``agent(start_from="SID:MSG")``, ``job_output`` / ``list_jobs``, ``archive_agent``. Each of
those answers exactly like a target that does not exist, and nothing of the other project
changes. Cross-session work inside one project keeps working. The tool gateway is probed
in-process; one test runs the same calls inside a real worker turn of a scripted spec.
"""

import itertools
from types import SimpleNamespace

import pytest

from accounts.models import Membership
from collab.models import Branch, HeldDelivery, InboxEntry, Job, Message, Session
from collab.models.ids import new_id

_specs = itertools.count()


# --- helpers -----------------------------------------------------------------------------------


def call(api, address, tool, **arguments) -> dict:
    """One tool call as the branch at ``address`` through the gateway; the tool result."""
    r = api.post(f"/api/branches/{address}/tools/{tool}", {"arguments": arguments})
    assert r.status_code == 200, (tool, r.status_code, r.content)
    return r.json()


def code_of(result: dict) -> str | None:
    return result["details"].get("code") if result["is_error"] else None


def finish(api, job_id: str) -> dict:
    """Run a queued job in this process exactly as a worker runs it (unless a worker process,
    when one is running, claimed it first), and answer its terminal execution."""
    from collab.runtime.loop import run_job

    run_job(job_id)
    return api.wait(job_id)


def make_spec(owner_api, slug: str, script=(), **fields) -> str:
    agent_id = f"bot{next(_specs)}"
    body = {"agent_id": agent_id, "provider": "scripted", "script": script if isinstance(script, dict) else list(script), **fields}
    r = owner_api.post(f"/api/projects/{slug}/agent-specs", body)
    assert r.status_code == 201, r.content
    return agent_id


def open_session(api, slug: str, agent_id: str, title: str, prompt: str = "hello"):
    """A session with one finished user turn (run in-process); its main branch's address."""
    r = api.post(f"/api/projects/{slug}/sessions", {"title": title, "agent_id": agent_id})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    assert finish(api, r.json()["execution_id"])["status"] == "succeeded"
    main = Branch.objects.select_related("tip").get(session_id=sid, name="main")
    return SimpleNamespace(api=api, sid=sid, address=main.address, title=title)


def spawn(at, name: str, prompt: str = "some work") -> SimpleNamespace:
    """A foreground ``agent`` call (its child a job the gateway waits for; ``run_queued`` or a
    worker runs it): the new branch's address and its job."""
    got = call(at.api, at.address, "agent", prompt=prompt, description=name)
    assert not got["is_error"], got
    job = Job.objects.get(pk=got["details"]["execution_id"])
    branch = Branch.objects.select_related("tip").get(pk=job.branch_id)
    return SimpleNamespace(address=branch.address, sid=branch.session_id, job_id=job.pk, pk=branch.pk,
                           tip=branch.tip_id)


def join(owner_api, person_api, slug: str, username: str, how: str, role: str = "member") -> None:
    """``how``: "none", "pending" (invited, never answered) or "accepted"."""
    if how == "none":
        return
    r = owner_api.post(f"/api/projects/{slug}/members", {"username": username, "role": role})
    assert r.status_code == 201 and r.json()["status"] == "pending", r.content
    if how == "accepted":
        (invitation,) = [i for i in person_api.get("/api/invitations").json() if i["project"] == slug]
        assert person_api.post(f"/api/invitations/{invitation['id']}/accept").status_code == 200


def footprint(project) -> dict:
    """Everything of a project an agent could change."""
    return {
        "branches": sorted(Branch.objects.filter(session__project=project).values_list("pk", "archived", "tip_id")),
        "jobs": Job.objects.filter(project=project).count(),
        "messages": Message.objects.filter(session__project=project).count(),
        "inbox": InboxEntry.objects.filter(session__project=project).count(),
        "holds": HeldDelivery.objects.filter(project=project).count(),
        "sessions": Session.objects.filter(project=project).count(),
    }


def masked(result: dict, probe: str) -> dict:
    """A tool result with the probed value masked: "no agent at <probe>" for a hidden target
    must read exactly as for a missing one."""
    return {"text": result["text"].replace(probe, "<probe>"), "is_error": result["is_error"],
            "details": {k: (v.replace(probe, "<probe>") if isinstance(v, str) else v) for k, v in result["details"].items()}}


# --- the two tenants -----------------------------------------------------------------------------


@pytest.fixture
def tenants(db, make_user, api_as, run_queued):
    """Projects ``proj-a`` (owned by ann) and ``proj-b`` (owned by bob), each made through the API,
    with a scripted spec. ``make(ann_in_b, bob_in_a)`` joins them as asked, then builds:
    in A, ann's session ``a`` and a second session ``a2`` with a live ``helper``; in B, bob's
    session ``b`` with a live ``reviewer`` (its spawn is a job of B's), and — when ann accepted
    B — ann's own session ``b_ann`` in B with ``annsb-scout`` (a person in both projects starting
    turns in each). Mirrored for bob in A. A foreground child is run in this process
    (``run_queued``) unless a worker process takes it first."""
    ann, bob = make_user("ann"), make_user("bob")
    ann_api, bob_api = api_as(ann), api_as(bob)
    for api, slug in ((ann_api, "proj-a"), (bob_api, "proj-b")):
        assert api.post("/api/projects", {"slug": slug, "name": slug.upper()}).status_code == 201

    def make(ann_in_b="none", bob_in_a="none"):
        join(bob_api, ann_api, "proj-b", "ann", ann_in_b)
        join(ann_api, bob_api, "proj-a", "bob", bob_in_a)
        spec_a, spec_b = make_spec(ann_api, "proj-a"), make_spec(bob_api, "proj-b")
        w = SimpleNamespace(ann=ann, bob=bob, ann_api=ann_api, bob_api=bob_api)
        w.a = open_session(ann_api, "proj-a", spec_a, "A secret title", prompt="A secret prompt")
        w.a2 = open_session(ann_api, "proj-a", spec_a, "A second session")
        w.a_helper = spawn(w.a2, "helper", "A helper work")
        w.b = open_session(bob_api, "proj-b", spec_b, "B secret title", prompt="B secret prompt")
        w.b_reviewer = spawn(w.b, "reviewer", "B secret review work")
        w.b_ann = w.a_bob = None
        if ann_in_b == "accepted":
            w.b_ann = open_session(ann_api, "proj-b", spec_b, "B ann title")
            w.b_ann_helper = spawn(w.b_ann, "annsb-scout", "B ann work")
        if bob_in_a == "accepted":
            w.a_bob = open_session(bob_api, "proj-a", spec_a, "A bob title")
            w.a_bob_helper = spawn(w.a_bob, "bobsa-scout", "A bob work")
        return w

    return make


def other_projects_refs(w, *, from_a: bool) -> dict:
    """What an agent of one project might try to reach in the other: names, ``SID:HEAD``s,
    session ids, fork points and job ids."""
    if from_a:
        names = ["reviewer"] + (["annsb-scout"] if w.b_ann else [])
        branches = [w.b_reviewer] + ([w.b_ann_helper] if w.b_ann else [])
        sessions = [w.b] + ([w.b_ann] if w.b_ann else [])
    else:
        names = ["helper"] + (["bobsa-scout"] if w.a_bob else [])
        branches = [w.a_helper] + ([w.a_bob_helper] if w.a_bob else [])
        sessions = [w.a, w.a2] + ([w.a_bob] if w.a_bob else [])
    return {
        "names": names,
        "addresses": [b.address for b in branches] + [s.address for s in sessions],
        "sessions": [s.sid for s in sessions],
        "forks": [f"{b.sid}:{b.tip}" for b in branches] + [s.address for s in sessions],
        "jobs": [b.job_id for b in branches],
    }


def assert_reaches_nothing(api, address, refs: dict, secrets: list[str]) -> None:
    """Every resolving tool answers for each reference exactly what it answers for a target
    that does not exist ("not_found"), and no listing names anything of the other project."""
    missing = {"names": "no-such-agent", "addresses": f"{new_id()}:{new_id()}", "sessions": new_id(),
               "forks": f"{new_id()}:{new_id()}", "jobs": new_id()}
    probes = {
        "names": [("send_message", "to", {"message": "hi"}), ("agent", "to", {"prompt": "go"}),
                  ("read_conversation", "session_id", {}), ("archive_agent", "to", {})],
        "addresses": [("send_message", "to", {"message": "hi"}), ("agent", "to", {"prompt": "go"}),
                      ("read_conversation", "session_id", {}), ("archive_agent", "to", {})],
        "sessions": [("read_conversation", "session_id", {})],
        "forks": [("agent", "start_from", {"prompt": "fork it", "description": "forked"}),
                  ("agent", "start_from", {"prompt": "fork it", "run_in_background": True})],
        "jobs": [("job_output", "job_id", {"block": False})],
    }
    for kind, refs_of_kind in refs.items():
        for tool, key, args in probes[kind]:
            absent = call(api, address, tool, **args, **{key: missing[kind]})
            assert code_of(absent) == "not_found", (tool, absent)
            for ref in refs_of_kind:
                got = call(api, address, tool, **args, **{key: ref})
                assert masked(got, ref) == masked(absent, missing[kind]), (tool, key, ref, got)

    for scope in ("session", "all", "archived"):
        listed = call(api, address, "list_agents", scope=scope, limit=200)
        assert not listed["is_error"], listed
        shown = listed["text"] + repr(listed["details"])
        for secret in secrets:
            assert secret not in shown, (scope, secret, listed)
    jobs = call(api, address, "list_jobs", limit=200)
    shown = jobs["text"] + repr(jobs["details"])
    for job_id in refs["jobs"]:
        assert job_id not in shown


COMBINATIONS = [
    ("none", "none"),
    ("pending", "none"),
    ("none", "pending"),
    ("accepted", "none"),
    ("none", "accepted"),
    ("pending", "accepted"),
    ("accepted", "accepted"),
]


# the richest combination runs on both databases; the rest, the same access rules, in one run
@pytest.mark.parametrize("ann_in_b,bob_in_a", [
    pytest.param(a, b, id=f"ann-in-b:{a},bob-in-a:{b}",
                 marks=() if (a, b) == ("accepted", "accepted") else pytest.mark.one_database("sqlite"))
    for a, b in COMBINATIONS])
def test_no_agent_tool_reaches_the_other_project_whatever_the_memberships(tenants, ann_in_b, bob_in_a):
    """With every membership combination between the two people (a person
    in both projects starting turns in each included), an agent of project A — through the tool
    gateway, acting as its branch — delivers to, reads, forks from, archives, lists and reads
    the jobs of nothing in project B, by name, ``SID:HEAD``, session id or job id: each answer is
    the "not found" of a missing target. And the same holds from B towards A. Nothing of the
    other project changes."""
    w = tenants(ann_in_b, bob_in_a)
    a_project = Session.objects.get(pk=w.a.sid).project
    b_project = Session.objects.get(pk=w.b.sid).project
    before = footprint(a_project), footprint(b_project)

    b_secrets = [w.b.sid, "B secret", "reviewer", w.b_reviewer.job_id] + ([w.b_ann.sid, "annsb-scout"] if w.b_ann else [])
    assert_reaches_nothing(w.ann_api, w.a.address, other_projects_refs(w, from_a=True), b_secrets)
    a_secrets = [w.a.sid, w.a2.sid, "A secret", "A second", "helper"] + ([w.a_bob.sid, "bobsa-scout"] if w.a_bob else [])
    assert_reaches_nothing(w.bob_api, w.b.address, other_projects_refs(w, from_a=False), a_secrets)
    if w.b_ann:  # ann's own agent in B sees nothing of A either, although ann owns A
        assert_reaches_nothing(w.ann_api, w.b_ann.address, other_projects_refs(w, from_a=False), a_secrets)
    if w.a_bob:
        assert_reaches_nothing(w.bob_api, w.a_bob.address, other_projects_refs(w, from_a=True), b_secrets)

    # the refused calls wrote nothing anywhere: no branch, job, message, inbox entry or hold
    assert (footprint(a_project), footprint(b_project)) == before


def test_cross_session_work_inside_the_project_keeps_working(tenants):
    """Confinement takes nothing away inside the project. From session ``a``,
    a name in another session of A (``helper``) resolves and receives a message and a task,
    ``list_agents(scope="all")`` lists both of A's sessions, ``read_conversation`` reads the
    other session by id, ``start_from`` forks at its node, and ``job_output`` reads the job
    ``a`` dispatched — while ann, also a member of B, reaches nothing there."""
    w = tenants("accepted", "accepted")
    sent = call(w.ann_api, w.a.address, "send_message", to="helper", message="hi helper")
    assert not sent["is_error"] and sent["details"]["to"] == w.a_helper.address, sent
    task = call(w.ann_api, w.a.address, "agent", to=w.a_helper.address, prompt="another task")
    assert not task["is_error"], task
    listed = call(w.ann_api, w.a.address, "list_agents", scope="all")
    assert {g["session_id"] for g in listed["details"]["sessions"]} >= {w.a.sid, w.a2.sid}
    assert w.b.sid not in listed["text"] and w.b_ann.sid not in listed["text"]
    read = call(w.ann_api, w.a.address, "read_conversation", session_id=w.a2.sid)
    assert not read["is_error"] and read["details"]["session_id"] == w.a2.sid
    fork = call(w.ann_api, w.a.address, "agent", prompt="continue", description="forked",
                start_from=f"{w.a2.sid}:{w.a_helper.tip}")
    assert not fork["is_error"] and fork["details"]["session_id"] == w.a2.sid, fork
    mine = call(w.ann_api, w.a.address, "job_output", job_id=fork["details"]["execution_id"], block=False)
    assert not mine["is_error"], mine


def test_a_live_reviewer_elsewhere_never_replaces_the_callers_archived_one(tenants):
    """``reviewer`` is archived in the caller's session, live in another
    session of the same project and live in project B (whose owner invited the caller, who
    accepted). Delivering to ``reviewer`` is refused as archived — it is never silently sent to
    another branch — and B's reviewer receives nothing. From a session without its own
    ``reviewer``, the name finds the project's live one, never B's."""
    w = tenants("accepted", "none")
    own = spawn(w.a, "reviewer", "my old review")
    assert not call(w.ann_api, w.a.address, "archive_agent", to="reviewer", reason="done")["is_error"]
    elsewhere = spawn(w.a2, "reviewer", "a live review in A")
    b_project = Session.objects.get(pk=w.b.sid).project
    b_before = footprint(b_project)

    for tool, args in (("send_message", {"message": "please review"}), ("agent", {"prompt": "please review"})):
        got = call(w.ann_api, w.a.address, tool, to="reviewer", **args)
        assert code_of(got) == "archived", (tool, got)
    read = call(w.ann_api, w.a.address, "read_conversation", session_id="reviewer")
    assert read["details"]["branch"] == own.pk and read["details"]["archived"] is True

    third = open_session(w.ann_api, "proj-a", Session.objects.get(pk=w.a.sid).agent_spec.agent_id, "A third")
    got = call(w.ann_api, third.address, "send_message", to="reviewer", message="please review")
    assert not got["is_error"] and got["details"]["to"] == elsewhere.address, got
    assert footprint(b_project) == b_before
    assert not Job.objects.filter(branch_id=w.b_reviewer.pk).exclude(pk=w.b_reviewer.job_id).exists()


def test_held_deliveries_resolve_inside_the_project_too(tenants):
    """Under a watch policy: with A's deliveries held for confirmation, a message to
    B's ``reviewer`` (by name or ``SID:HEAD``) is "not found" at once — no hold is written that a
    member could approve into B — while a message to A's ``helper`` is held for A's helper."""
    w = tenants("accepted", "accepted")
    assert w.ann_api.patch("/api/projects/proj-a", {"watch_policy": "confirm_deliveries"}).status_code == 200
    for to in ("reviewer", w.b_reviewer.address):
        assert code_of(call(w.ann_api, w.a.address, "send_message", to=to, message="x")) == "not_found"
        assert code_of(call(w.ann_api, w.a.address, "agent", to=to, prompt="x")) == "not_found"
    assert not HeldDelivery.objects.exists()
    held = call(w.ann_api, w.a.address, "send_message", to="helper", message="for A's helper")
    assert held["details"].get("held") is True, held
    hold = HeldDelivery.objects.get()
    assert (hold.target_branch_id, hold.project.slug) == (w.a_helper.pk, "proj-a")


def test_rest_routes_resolve_for_the_person_but_the_gateway_acts_as_the_branch(tenants):
    """The routes that take an address resolve it for a *person*, who may
    read any project they accepted — ann reads B's reviewer by name and by ``SID:HEAD`` — but the
    tool gateway acts as the branch, so the same read run through A's branch is "not found".
    bob, never invited to A, gets the 404 of a missing branch for A's addresses."""
    w = tenants("accepted", "none")
    for ref in ("reviewer", w.b_reviewer.address):
        r = w.ann_api.get(f"/api/branches/{ref}/transcript")
        assert r.status_code == 200 and r.json()["session_id"] == w.b.sid, (ref, r.content)
        assert code_of(call(w.ann_api, w.a.address, "read_conversation", session_id=ref)) == "not_found"
    # the gateway on B's branch (ann is a member there) acts inside B: A is out of reach
    assert code_of(call(w.ann_api, w.b_ann.address, "read_conversation", session_id=w.a.address)) == "not_found"
    hidden = w.bob_api.get(f"/api/branches/{w.a.address}/transcript")
    missing = w.bob_api.get(f"/api/branches/{w.a.sid}:{new_id()}/transcript")
    assert hidden.status_code == missing.status_code == 404
    assert w.bob_api.post(f"/api/branches/{w.a.address}/tools/list_agents", {"arguments": {}}).status_code == 404


def test_start_from_refuses_a_read_only_sub_agent_session(team, api_as):
    """``agent(start_from="SID:MSG")`` at a node of an OpenWork
    explorer's (child) session — same project, the caller may read it — is refused with
    ``child_session_read_only``: nothing adds branches to a read-only sub-agent session. Its
    history stays readable with ``read_conversation``."""
    owner, member = api_as(team.owner), api_as(team.member)
    ow_spec = make_spec(owner, "alpha", toolset="openwork")
    r = member.post("/api/projects/alpha/sessions", {"title": "ow", "agent_id": ow_spec})
    ow_sid = r.json()["id"]
    assert member.post(f"/api/sessions/{ow_sid}/turns", {"prompt": "look around"}).status_code == 202
    ow_address = f"{ow_sid}:{member.get(f'/api/sessions/{ow_sid}').json()['head']}"
    spawned = call(member, ow_address, "spawn_agent", task_name="scout", message="scout the code")
    assert not spawned["is_error"], spawned
    child_job = Job.objects.get(pk=spawned["details"]["execution_id"])
    child_node = f"{child_job.session_id}:{child_job.prompt_msg_id}"
    assert Session.objects.get(pk=child_job.session_id).parent_session_id == ow_sid

    collab = open_session(member, "alpha", make_spec(owner, "alpha"), "collab")
    child_branches = Branch.objects.filter(session_id=child_job.session_id).count()
    jobs = Job.objects.count()
    for background in (False, True):
        got = call(member, collab.address, "agent", prompt="write here", start_from=child_node,
                   run_in_background=background)
        assert code_of(got) == "child_session_read_only", got
    assert Branch.objects.filter(session_id=child_job.session_id).count() == child_branches
    assert Job.objects.count() == jobs
    read = call(member, collab.address, "read_conversation", session_id=child_node)
    assert not read["is_error"] and read["details"]["session_id"] == child_job.session_id


@pytest.mark.slow
def test_a_real_worker_turn_reaches_nothing_of_the_other_project(transactional_db, tenants, worker):
    """The same confinement inside a real turn run by the worker process. ann belongs
    to both projects; a scripted spec in A calls, in one step, ``send_message`` and ``agent(to=…)``
    to ``reviewer`` (archived in its own session, live in B), ``agent(to=B's SID:HEAD)``,
    ``list_agents(scope="all")``, ``read_conversation`` of B's session, ``agent(start_from=B's
    node)``, ``job_output`` of B's job and ``list_jobs``. The archived reviewer is reported
    archived, every B reference is "not found", and B receives nothing."""
    w = tenants("accepted", "accepted")
    spawn(w.a, "reviewer", "my old review")
    assert not call(w.ann_api, w.a.address, "archive_agent", to="reviewer")["is_error"]
    b_project = Session.objects.get(pk=w.b.sid).project
    b_before = footprint(b_project)
    calls = [
        {"name": "send_message", "arguments": {"to": "reviewer", "message": "review this"}},
        {"name": "agent", "arguments": {"to": "reviewer", "prompt": "review this"}},
        {"name": "agent", "arguments": {"to": w.b_reviewer.address, "prompt": "review this"}},
        {"name": "send_message", "arguments": {"to": "annsb-scout", "message": "hi"}},
        {"name": "list_agents", "arguments": {"scope": "all"}},
        {"name": "read_conversation", "arguments": {"session_id": w.b.sid}},
        {"name": "agent", "arguments": {"prompt": "fork", "start_from": f"{w.b_reviewer.sid}:{w.b_reviewer.tip}"}},
        {"name": "job_output", "arguments": {"job_id": w.b_reviewer.job_id, "block": False}},
        {"name": "list_jobs", "arguments": {}},
    ]
    spec = make_spec(w.ann_api, "proj-a", {"user": [{"tool_calls": calls}, {"text": "finished"}]})
    r = w.ann_api.post(f"/api/sessions/{w.a.sid}/turns", {"prompt": "try everything", "agent_id": spec})
    assert r.status_code == 202, r.content
    done = w.ann_api.wait(r.json()["execution_id"], timeout=60)
    assert done["status"] == "succeeded", done

    results = list(Message.objects.filter(job_id=done["id"], role="tool").order_by("depth"))
    assert [m.metadata["tool"] for m in results] == [c["name"] for c in calls]
    codes = [m.metadata["details"].get("code") if m.metadata["is_error"] else None for m in results]
    assert codes == ["archived", "archived", "not_found", "not_found", None, "not_found", "not_found", "not_found", None]
    listing, jobs = results[4], results[8]
    for secret in (w.b.sid, w.b_ann.sid, "B secret", "annsb-scout"):
        assert secret not in listing.text
    assert w.b_reviewer.job_id not in jobs.text
    assert footprint(b_project) == b_before
    assert Membership.objects.filter(user=w.ann, project=b_project, accepted_at__isnull=False).exists()
