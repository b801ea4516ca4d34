"""One access layer (docs/contract.md#authorization-and-visibility).

Every rule lives in ``collab/access.py`` (``accounts/policy.py`` for role → capability), and
every entry point asks it. These tests hold each rule to ONE decision per role — owner,
maintainer, member, viewer, outsider — whichever door the request comes through: the REST API,
the pages, an agent's tool run through the tool registry (as a turn runs it), and the tool
gateway (``POST /api/branches/{address}/tools/{tool}``). A door that decides differently from
the others fails here, whatever the rule's code looks like.

Rows are built in this process through the public entry points; no turn needs to run, so no
worker is started (queued jobs stay queued). "Own" rows of the viewer were made while they
were a member (then demoted); the outsider's while they were a member of alpha (then removed):
rights follow the role now, not the role then.
"""

import copy
import dataclasses
import re
from dataclasses import dataclass, field

import pytest

from accounts.models import Membership
from collab.models import Branch, HeldDelivery, HoldStatus, InboxEntry, Job, JobStatus
from collab.models.ids import new_id
from tests.conftest import SharedWorld, api_client_of, browser_client, copy_of_team, make_team, scripted_sessions

ROLES = ("owner", "maintainer", "member", "viewer", "outsider")
OK, FORBIDDEN, NOT_FOUND = "ok", "forbidden", "not_found"

ANY_READER = dict(owner=OK, maintainer=OK, member=OK, viewer=OK, outsider=NOT_FOUND)
ANY_WRITER = dict(owner=OK, maintainer=OK, member=OK, viewer=FORBIDDEN, outsider=NOT_FOUND)
MAINTAINERS = dict(owner=OK, maintainer=OK, member=FORBIDDEN, viewer=FORBIDDEN, outsider=NOT_FOUND)
NOBODY = dict.fromkeys(ROLES, NOT_FOUND)

SCRIPT = [{"text": "done"}]


# --- decisions, as each door reports them ----------------------------------------------------


def api_decision(response, ok_status: int) -> str:
    if response.status_code == ok_status:
        return OK
    assert response.status_code in (403, 404), response.content
    code = response.json()["code"]
    assert code == {403: FORBIDDEN, 404: NOT_FOUND}[response.status_code], response.content
    return code


def page_decision(response, ok_status: int = 302) -> str:
    if response.status_code == ok_status:
        return OK
    assert response.status_code in (403, 404), (response.status_code, response.content[:300])
    return {403: FORBIDDEN, 404: NOT_FOUND}[response.status_code]


def tool_decision(result) -> str:
    """A tool result (a ``ToolResult`` or the gateway's JSON) as a decision."""
    body = result if isinstance(result, dict) else result.as_dict()
    if not body["is_error"]:
        return OK
    code = body["details"].get("code")
    assert code in (FORBIDDEN, NOT_FOUND), body
    return code


# --- the world ---------------------------------------------------------------------------------


@dataclass
class World:
    """Project alpha's session ``sid`` (created by the member: its main branch is theirs) with,
    for each person, a fork of their own (``mine``, with its queued execution) and a fork someone
    else started (``theirs``: the maintainer's for the member, else the member's); a second
    session ``sid2`` of the owner's; and the outsider's session in project beta."""

    team: object
    api_as: object
    browser_of: object
    sid: str
    head: str  # the member's prompt on main
    main: Branch
    sid2: str
    main2: Branch
    beta_main: Branch
    mine: dict = field(default_factory=dict)  # person -> a branch they started in ``sid``
    theirs: dict = field(default_factory=dict)  # person -> a branch someone else started in ``sid``

    def user(self, role):
        return getattr(self.team, role)

    def api(self, role):
        return self.api_as(self.user(role))

    def page(self, role):
        return self.browser_of(self.user(role))

    def own(self, role) -> Branch:
        return Branch.objects.select_related("session", "tip").get(pk=self.mine[role])

    def others(self, role) -> Branch:
        return Branch.objects.select_related("session", "tip").get(pk=self.theirs[role])

    def acting(self, role) -> Branch:
        """The branch an agent working for ``role`` stands on: their own fork (the outsider's
        agents work in project beta)."""
        return self.beta_main if role == "outsider" else self.own(role)

    def actor(self, role, branch: Branch | None = None):
        from collab.services.acting import Actor

        branch = Branch.objects.select_related("session", "session__project", "tip").get(
            pk=(branch or self.acting(role)).pk)
        return Actor(user=self.user(role), session=branch.session, branch=branch)

    def run_tool(self, role, tool: str, branch: Branch | None = None, **arguments):
        """The tool as a turn runs it: through the registry, for an agent acting for ``role``."""
        from collab.tools.registry import run_tool
        from collab.tools.surface import branch_tools

        actor = self.actor(role, branch)
        return run_tool(actor, tool, arguments, tools=branch_tools(actor.branch))

    def gateway(self, role, tool: str, branch: Branch | None = None, **arguments):
        """The tool through the gateway, acting as ``branch`` (default: ``role``'s acting one)."""
        address = (branch or self.acting(role)).address
        return self.api(role).post(f"/api/branches/{address}/tools/{tool}", {"arguments": arguments})


def fork_on_page(client, sid: str, at: str) -> str:
    r = client.post(f"/s/{sid}/m/{at}/fork", {"prompt": "a line of work"})
    assert r.status_code == 302, r.content
    return re.search(r"branch=([^&]+)", r["Location"]).group(1)


def post_turn(api, sid: str) -> str:
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello there"})
    assert r.status_code == 202, r.content
    return api.get(f"/api/sessions/{sid}").json()["head"]


def build_world(team, api_as, browser_of, scripted_session) -> World:
    member_api, sid = scripted_session(team.member, SCRIPT)
    head = post_turn(member_api, sid)
    owner_api = api_as(team.owner)
    r = owner_api.post("/api/projects/alpha/sessions", {"title": "elsewhere", "agent_id": "bot"})
    assert r.status_code == 201, r.content
    sid2 = r.json()["id"]
    head2 = post_turn(owner_api, sid2)
    beta_api, beta_sid = scripted_session(team.outsider, SCRIPT, project="beta", agent_id="betabot")
    beta_head = post_turn(beta_api, beta_sid)

    # everyone starts a branch of their own while they may (the viewer and the outsider as members) …
    Membership.objects.filter(user=team.viewer, project=team.alpha).update(role="member")
    Membership.objects.create(user=team.outsider, project=team.alpha, role="member")
    pages = {role: browser_of(getattr(team, role)) for role in ROLES}
    mine = {role: fork_on_page(pages[role], sid, head) for role in ROLES}
    theirs = {role: fork_on_page(pages["maintainer" if role == "member" else "member"], sid, head) for role in ROLES}
    # … then the viewer is a viewer again and the outsider is out
    Membership.objects.filter(user=team.viewer, project=team.alpha).update(role="viewer")
    Membership.objects.filter(user=team.outsider, project=team.alpha).delete()

    def branch_at(sid_, head_):
        return Branch.objects.select_related("session", "tip").get(messages__pk=head_, session_id=sid_)

    return World(team=team, api_as=api_as, browser_of=browser_of, sid=sid, head=head, main=branch_at(sid, head),
                 sid2=sid2, main2=branch_at(sid2, head2), beta_main=branch_at(beta_sid, beta_head),
                 mine=mine, theirs=theirs)


def make_user(username, password="pw-secret-123"):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=username, password=password)


def build_shared_world(request) -> World:
    team = make_team(make_user)
    return build_world(team, api_client_of, browser_client, scripted_sessions(api_client_of, team))


# Built once for the run of tests asking for ``world`` (all of them but the last): every test
# reads it in its own ``db`` transaction, rolled back at its end (tests/conftest.py).
WORLD = SharedWorld(lambda item: "world" in item.fixturenames, build_shared_world)


@pytest.fixture
def shared_world(request) -> World:
    return WORLD.get(request)


@pytest.fixture
def world(shared_world, db) -> World:
    """The shared world (set up before ``db``), with model instances of this test's own."""
    return dataclasses.replace(copy.deepcopy(shared_world), team=copy_of_team(shared_world.team))


def each_role(decide) -> dict:
    """``{role: decide(role)}`` for every role: one table, compared whole with the rule's."""
    return {role: decide(role) for role in ROLES}


def expect(rule: dict, doors: int | dict) -> dict:
    """The rule's decision at every door: ``doors`` per role (an int: the same for all)."""
    return {role: [rule[role]] * (doors if isinstance(doors, int) else doors[role]) for role in ROLES}


EXCEPT_VIEWER = {role: 1 if role == "viewer" else 2 for role in ROLES}  # a viewer acts as no branch: no gateway door


# --- read a branch -----------------------------------------------------------------------------


def test_read_a_branch_one_decision_everywhere(world):
    """Anyone in the project reads a branch; an outsider finds nothing — the API's
    transcript, the session page, ``read_conversation`` (by address and by session id) as a turn
    runs it, and through the gateway."""
    target = world.main

    def decide(role):
        decisions = [
            api_decision(world.api(role).get(f"/api/branches/{target.address}/transcript"), 200),
            page_decision(world.page(role).get(f"/s/{world.sid}/", {"branch": target.pk}), 200),
            tool_decision(world.run_tool(role, "read_conversation", session_id=target.address)),
            tool_decision(world.run_tool(role, "read_conversation", session_id=world.sid)),
        ]
        if role != "viewer":  # a viewer acts as no branch (test_acting_as_a_branch_through_the_gateway)
            r = world.gateway(role, "read_conversation", session_id=target.address)
            assert r.status_code == 200, r.content
            decisions.append(tool_decision(r.json()))
        return decisions

    assert each_role(decide) == expect(ANY_READER, {role: 4 if role == "viewer" else 5 for role in ROLES})


def test_outsiders_answer_is_a_missing_addresss_answer(world):
    """``access_branch`` answers an outsider exactly as it answers an address that does
    not exist (the API, a turn's tool and the gateway alike)."""
    hidden, missing = world.main.address, f"{world.sid}:{new_id()}"

    def masked(text, address):
        return text.replace(address, "ADDRESS")

    outsider = world.api("outsider")
    member = world.api("member")
    a = outsider.get(f"/api/branches/{hidden}/transcript")
    b = member.get(f"/api/branches/{missing}/transcript")
    assert (a.status_code, masked(a.content.decode(), hidden)) == (b.status_code, masked(b.content.decode(), missing))
    t1 = world.run_tool("outsider", "read_conversation", session_id=hidden).as_dict()
    t2 = world.run_tool("outsider", "read_conversation", session_id=missing).as_dict()
    assert masked(t1["text"], hidden) == masked(t2["text"], missing)
    g1 = outsider.post(f"/api/branches/{hidden}/tools/todo_list", {"arguments": {}})
    g2 = outsider.post(f"/api/branches/{missing}/tools/todo_list", {"arguments": {}})
    assert (g1.status_code, masked(g1.content.decode(), hidden)) == (g2.status_code, masked(g2.content.decode(), missing))


# --- post a turn -------------------------------------------------------------------------------


def test_post_a_turn_one_decision_everywhere(world):
    """``turn.start``: the API's turn, the page's composer, and the agent's way to start
    a turn on a branch (``send_message``, as a turn runs it and through the gateway); a refused
    door admits nothing."""

    def decide(role):
        before = Job.objects.count() + InboxEntry.objects.count()  # a busy branch queues a message in its inbox
        decisions = [
            api_decision(world.api(role).post(f"/api/sessions/{world.sid}/turns", {"prompt": "from the api"}), 202),
            page_decision(world.page(role).post(f"/s/{world.sid}/turns", {"prompt": "from the page"})),
            tool_decision(world.run_tool(role, "send_message", to=world.main.address, message="from a turn")),
        ]
        if role != "viewer":
            decisions.append(tool_decision(
                world.gateway(role, "send_message", to=world.main.address, message="from the gateway").json()))
        admitted = Job.objects.count() + InboxEntry.objects.count() - before
        assert admitted == (len(decisions) if decisions[0] == OK else 0), role
        return decisions

    assert each_role(decide) == expect(ANY_WRITER, {role: 3 if role == "viewer" else 4 for role in ROLES})


# --- fork --------------------------------------------------------------------------------------


def test_fork_one_decision_everywhere(world):
    """Forking a node — the page's fork form, and an agent's ``agent(start_from="SID:MSG")``
    as a turn runs it and through the gateway; a refused door makes no branch."""
    at = f"{world.sid}:{world.head}"

    def decide(role):
        before = Branch.objects.count()
        decisions = [
            page_decision(world.page(role).post(f"/s/{world.sid}/m/{world.head}/fork", {"prompt": "fork"})),
            tool_decision(world.run_tool(role, "agent", prompt="fork", start_from=at, run_in_background=True)),
        ]
        if role != "viewer":
            decisions.append(tool_decision(
                world.gateway(role, "agent", prompt="fork", start_from=at, run_in_background=True).json()))
        assert Branch.objects.count() - before == (len(decisions) if decisions[0] == OK else 0), role
        return decisions

    assert each_role(decide) == expect(ANY_WRITER, {role: 2 if role == "viewer" else 3 for role in ROLES})


# --- archive: own branch vs another's ----------------------------------------------------------


def archive_everywhere(world, role, target: Branch) -> list[str]:
    """Archive ``target`` through every door (archiving is idempotent: each allowed door answers
    success), then whether it is archived: API, page, tool in a turn, gateway, state."""
    decisions = [
        api_decision(world.api(role).post(f"/api/branches/{target.address}/archive", {"reason": "api"}), 200),
        page_decision(world.page(role).post(f"/s/{world.sid}/b/{target.pk}/archive", {"reason": "page"})),
        tool_decision(world.run_tool(role, "archive_agent", to=target.address, reason="turn")),
    ]
    if role != "viewer":
        decisions.append(tool_decision(world.gateway(role, "archive_agent", to=target.address).json()))
    archived = Branch.objects.get(pk=target.pk).archived
    decisions.append(OK if archived else decisions[0])
    return decisions


def test_archive_own_and_someone_elses_branch(world):
    """Who started a branch archives it while they may start turns
    (``branch.archive_own``: a viewer, demoted since, may not); maintainers and owners archive
    anyone's (``branch.archive_any``: a member only their own, 403); an outsider (removed since)
    finds nothing. A refused door leaves the branch as it was."""
    doors = {role: 4 if role == "viewer" else 5 for role in ROLES}
    assert each_role(lambda role: archive_everywhere(world, role, world.own(role))) == expect(ANY_WRITER, doors)
    assert each_role(lambda role: archive_everywhere(world, role, world.others(role))) == expect(MAINTAINERS, doors)


def test_page_offers_archive_exactly_when_allowed(world):
    """The composer's archive form is offered by the same rule (``access.can_archive``)."""

    def offered(role):
        found = []
        for target in (world.own(role), world.others(role)):
            html = world.page(role).get(f"/s/{world.sid}/", {"branch": target.pk}).content.decode()
            found.append(f"/s/{world.sid}/b/{target.pk}/archive" in html)
        return found

    people = [role for role in ROLES if role != "outsider"]
    assert {role: offered(role) for role in people} == {
        role: [ANY_WRITER[role] == OK, MAINTAINERS[role] == OK] for role in people}


# --- cancel: own execution vs another's --------------------------------------------------------


def cancel_everywhere(world, role, branch: Branch) -> list[str]:
    """Cancel the queued execution on ``branch`` through the API's command and the page's button
    (a repeated cancel of a cancelled execution is accepted and changes nothing), then whether
    it is cancelled."""
    job = Job.objects.get(branch=branch)
    api = world.api(role).post(f"/api/executions/{job.pk}/commands", {
        "command_id": "c1", "action": "execution.cancel", "expected_version": job.version, "payload": {}})
    job.refresh_from_db()
    page = world.page(role).post(f"/s/{world.sid}/jobs/{job.pk}/cancel", {"version": str(job.version)})
    decisions = [api_decision(api, 202), page_decision(page)]
    job.refresh_from_db()
    decisions.append(OK if job.status == JobStatus.CANCELLED else decisions[0])
    return decisions


def test_cancel_own_and_someone_elses_execution(world):
    """Members cancel executions they started (``execution.cancel_own``: a viewer,
    demoted since, may not); maintainers and owners cancel any (``runtime.control``: a member
    only theirs, 403); an outsider finds nothing. A refused door leaves the execution queued."""
    assert each_role(lambda role: cancel_everywhere(world, role, world.own(role))) == expect(ANY_WRITER, 3)
    assert each_role(lambda role: cancel_everywhere(world, role, world.others(role))) == expect(MAINTAINERS, 3)


# --- acting as a branch through the gateway ----------------------------------------------------


def test_acting_as_a_branch_through_the_gateway(world):
    """Members act as branches they started, maintainers and owners as any, viewers
    never; an outsider finds nothing (``access.require_can_act_as``)."""

    def decide(role, target):
        r = world.gateway(role, "todo_list", branch=target)
        return [OK if r.status_code == 200 else api_decision(r, 200)]

    assert each_role(lambda role: decide(role, world.own(role))) == expect(ANY_WRITER, 1)
    assert each_role(lambda role: decide(role, world.others(role))) == expect(MAINTAINERS, 1)


# --- approve a held delivery (docs/contract.md#watch-policy) -----------------------------------


def hold(world, text: str) -> HeldDelivery:
    """A delivery of the member's agent on main (session ``sid``), held by the watch policy."""
    result = world.run_tool("member", "send_message", branch=world.main, to=world.main2.address, message=text)
    assert not result.is_error, result
    return HeldDelivery.objects.get(text=text)


def test_approve_a_hold(world):
    """Who may post in the sender's session decides its held deliveries; the API and the
    page decide alike, and a refused decision leaves the hold pending."""
    assert world.api("owner").patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200

    def decide(role):
        by_api, by_page = hold(world, f"{role} api"), hold(world, f"{role} page")
        assert by_api.sender_session_id == by_page.sender_session_id == world.sid
        decisions = [
            api_decision(world.api(role).post(f"/api/holds/{by_api.pk}/approve"), 200),
            page_decision(world.page(role).post(f"/s/{world.sid}/holds/{by_page.pk}", {"decision": "approve"})),
        ]
        for h in (by_api, by_page):
            h.refresh_from_db()
            decisions.append(OK if h.status == HoldStatus.APPROVED else decisions[0])
        return decisions

    assert each_role(decide) == expect(ANY_WRITER, 4)


def test_a_hold_is_decided_only_on_its_own_sessions_page(world):
    """The page's URL names the sender session: a hold of another session is "not found"."""
    assert world.api("owner").patch("/api/projects/alpha", {"watch_policy": "confirm_deliveries"}).status_code == 200
    held = hold(world, "held")
    assert world.page("owner").post(f"/s/{world.sid2}/holds/{held.pk}", {"decision": "approve"}).status_code == 404
    held.refresh_from_db()
    assert held.status == HoldStatus.PENDING


# --- read a job's output: job ownership (docs/contract.md#plans-and-jobs) ----------------------


def test_job_output_only_in_the_dispatching_session(world):
    """An agent in the session that dispatched a job reads its output, for whoever it
    works for who may read the job; an agent of another session finds nothing — even the
    owner's, who may read the job itself through the API (the rule is the session's, not the
    role's); an outsider's agent finds nothing."""
    result = world.run_tool("member", "agent", branch=world.main, prompt="background work", run_in_background=True)
    assert not result.is_error, result
    job_id = result.details["execution_id"]

    def in_dispatcher(role):
        decisions = [tool_decision(world.run_tool(role, "job_output", job_id=job_id, block=False))]
        if role != "viewer":
            decisions.append(tool_decision(world.gateway(role, "job_output", job_id=job_id, block=False).json()))
        return decisions

    def elsewhere(role):
        branch = None if role == "outsider" else world.main2
        decisions = [tool_decision(world.run_tool(role, "job_output", branch=branch, job_id=job_id, block=False))]
        if role in ("owner", "maintainer"):  # who may act as the owner's branch in ``sid2``
            decisions.append(tool_decision(world.gateway(role, "job_output", branch=world.main2, job_id=job_id,
                                                          block=False).json()))
        return decisions

    assert each_role(in_dispatcher) == expect(ANY_READER, EXCEPT_VIEWER)
    assert each_role(elsewhere) == expect(NOBODY, {role: 2 if role in ("owner", "maintainer") else 1 for role in ROLES})
    readers = [role for role in ROLES if role != "outsider"]
    assert {role: world.api(role).get(f"/api/executions/{job_id}").status_code for role in readers} == dict.fromkeys(readers, 200)


# --- the rules have one home -------------------------------------------------------------------


def test_the_scattered_rules_are_gone():
    """The old second homes of these rules are gone, so nobody calls them by mistake (the tests
    above are what hold the behaviour)."""
    import collab.access as access
    import collab.api as api
    import collab.selectors.jobs as jobs
    import collab.services.acting as acting
    import collab.services.addressing as addressing
    import collab.services.archive as archive
    import collab.services.cancel as cancel
    import collab.services.visibility as visibility
    import collab.services.watch as watch
    import collab.tools.collab_tools as collab_tools

    gone = [(archive, "check_can_archive"), (cancel, "check_can_cancel"), (watch, "access_hold"),
            (watch, "can_decide_holds"), (acting, "owns_branch"), (acting, "check_can_act_as"),
            (jobs, "owns_job"), (api, "_branch"), (access, "access_branch_by_id"), (addressing, "find_branch"),
            (addressing, "visible_sessions")]
    assert [f"{m.__name__}.{name}" for m, name in gone if name in vars(m)] == []
    assert visibility.can_change_visibility is access.can_change_visibility
    assert collab_tools.access_branch is access.access_branch
