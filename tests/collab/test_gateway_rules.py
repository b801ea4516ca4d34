"""The tool gateway (docs/contract.md#http-api): through it a member acts only as
branches they started, maintainers and owners as any; gateway calls continue the branch's
chain counters, so topology budgets bind across them as they do across turns."""

import pytest

from accounts.models import Membership


def head_address(api, sid, prompt="go") -> str:
    """A user turn (queued: no worker here) gives the session's main branch a head; its address."""
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"


def call(api, address, tool, **arguments):
    return api.post(f"/api/branches/{address}/tools/{tool}", {"arguments": arguments})


@pytest.fixture
def second_member(team, make_user):
    other = make_user("member2")
    Membership.objects.create(user=other, project=team.alpha, role="member")
    return other


def test_a_member_acts_only_as_branches_they_started(team, scripted_session, api_as, second_member):
    """A member's session's main branch: the member and the project's maintainer and owner may
    act as it; another member is refused (403, code), a viewer too, an outsider sees nothing (404)."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    address = head_address(api, sid)

    answers = {}
    for name, user in [("starter", team.member), ("maintainer", team.maintainer), ("owner", team.owner),
                       ("other_member", second_member), ("viewer", team.viewer), ("outsider", team.outsider)]:
        r = call(api_as(user), address, "todo_list")
        answers[name] = (r.status_code, r.json().get("code"))
    assert answers == {
        "starter": (200, None), "maintainer": (200, None), "owner": (200, None),
        "other_member": (403, "forbidden"), "viewer": (403, "forbidden"), "outsider": (404, "not_found"),
    }


def test_a_branch_spawned_by_a_members_agent_is_theirs_not_another_members(team, scripted_session, api_as, second_member):
    """A branch created by a job the member started (a background ``agent`` call through the
    gateway) is the member's own: they act as it; another member does not, a maintainer does."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    spawned = call(api, head_address(api, sid), "agent", prompt="look around", description="scout",
                   run_in_background=True).json()
    assert not spawned["is_error"], spawned
    child = spawned["details"]["address"]

    assert call(api, child, "todo_list").status_code == 200
    refused = call(api_as(second_member), child, "todo_list")
    assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    assert call(api_as(team.maintainer), child, "todo_list").status_code == 200


def test_max_messages_binds_across_consecutive_gateway_calls(team, scripted_session, api_as):
    """Topology budgets through the gateway: each call continues the acting branch's chain (its running,
    else latest, job), so a ping-pong of deliveries made from outside stops at ``max_messages``
    exactly as one made by turns does — with the budget's code, and nothing admitted."""
    from collab.models import Job

    owner = api_as(team.owner)
    assert owner.patch("/api/projects/alpha/limits", {"max_messages": 2}).status_code == 200
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    a = "main"  # the session's main branch by name: idle (no turn yet), so deliveries to it are jobs

    hop1 = call(api, a, "agent", prompt="first hop", description="b", run_in_background=True).json()
    assert not hop1["is_error"], hop1
    b = hop1["details"]["address"]
    hop2 = call(api, b, "send_message", to=a, message="second hop").json()
    assert not hop2["is_error"], hop2
    assert Job.objects.get(pk=hop2["details"]["delivery_id"]).chain_messages == 2

    jobs_before = Job.objects.count()
    hop3 = call(api, a, "send_message", to=b, message="third hop").json()
    assert hop3["is_error"] and hop3["details"]["code"] == "budget.messages_exhausted", hop3
    assert Job.objects.count() == jobs_before

    # reading stays available on an exhausted chain
    assert not call(api, a, "list_jobs").json()["is_error"]
