"""Internal branches: ``Branch.internal`` hides a branch from agents — absent from
``list_agents`` in every scope and not found by name (an explicit ``SID:HEAD`` still works) —
shows it dimmed with a badge to people, and is toggled by maintainers (API) and operators
(admin), audited as ``branch.internal_changed``.

In-process: tools run through the public gateway ``POST /api/branches/{address}/tools/{tool}``
and the turns that build the state run in this process (``run_inline``), so no worker is needed.
"""

import pytest
from django.test import Client
from django.urls import reverse

from collab.models import Branch, Event
from collab.services.branches import do_set_branch_internal
from tests.collab.test_collab_tools import call, error_code, open_session, spawn  # noqa: F401 (open_session: fixture)
from tests.collab.test_openwork_boundaries import ow_child

PASSWORD = "pw-secret-123"


def listed(agent, scope: str) -> set[str]:
    """Branch names ``list_agents`` shows the agent in ``scope``."""
    result = call(agent.api, agent.address, "list_agents", scope=scope)
    assert not result["is_error"], result
    return {b["name"] for s in result["details"]["sessions"] for b in s["branches"]}


@pytest.fixture
def hidden(team, open_session):
    """A member's session with three spawned branches: ``helper`` (internal), ``gone`` (internal,
    archived) and ``shown`` (not internal); plus a second session of the member's with an
    internal ``elsewhere`` branch (for the ``all`` scope)."""
    a = open_session(title="first")
    helper = spawn(a, "first task", description="helper")
    gone = spawn(a, "second task", description="gone")
    shown = spawn(a, "third task", description="shown")
    assert not call(a.api, a.address, "archive_agent", to=gone.address)["is_error"]
    b = open_session(title="second")
    elsewhere = spawn(b, "other task", description="elsewhere")
    for branch in (helper, gone, elsewhere):
        assert do_set_branch_internal(team.owner, branch, True)
    return a, helper, gone, shown, elsewhere


def test_internal_branches_are_absent_from_list_agents_in_every_scope(hidden):
    """``list_agents`` lists no internal branch in the ``session``, ``archived``
    and ``all`` scopes, while the other branches stay listed."""
    a, helper, gone, shown, elsewhere = hidden
    assert listed(a, "session") >= {"main", "shown"} and "helper" not in listed(a, "session")
    assert "gone" not in listed(a, "archived")
    everywhere = listed(a, "all")
    assert {"main", "shown"} <= everywhere
    assert not everywhere & {"helper", "elsewhere", "gone"}
    # cleared again, it is listed again
    do_set_branch_internal(None, helper, False)
    assert "helper" in listed(a, "session")


def test_agents_do_not_resolve_an_internal_branch_by_name_but_do_by_address(hidden):
    """An agent naming an internal branch (``send_message``, ``agent``,
    ``read_conversation``) gets ``not_found``, exactly like a missing name; its ``SID:HEAD``
    address still resolves for an agent acting for someone who may see the session."""
    a, helper, gone, shown, elsewhere = hidden
    missing = call(a.api, a.address, "send_message", message="ping", to="no-such-agent")
    assert error_code(missing) == "not_found"
    for name in ("helper", "elsewhere"):
        assert error_code(call(a.api, a.address, "send_message", message="ping", to=name)) == "not_found"
        assert error_code(call(a.api, a.address, "agent", prompt="more", to=name)) == "not_found"
        assert error_code(call(a.api, a.address, "read_conversation", session_id=name)) == "not_found"
    assert not call(a.api, a.address, "read_conversation", session_id="shown")["is_error"]
    by_address = call(a.api, a.address, "read_conversation", session_id=helper.address)
    assert not by_address["is_error"], by_address
    assert "first task" in by_address["text"]
    # people still find it by name (only agents are hidden from)
    assert a.api.get("/api/branches/helper/transcript").status_code == 200


def test_maintainers_toggle_internal_through_the_api_audited(team, open_session, api_as):
    """``PATCH /api/branches/{address} {"internal": …}`` — a maintainer (or
    owner) sets and clears it, each change a ``branch.internal_changed`` Event with its actor; a
    member and a viewer get 403, an outsider 404 (like a missing branch); bad input is a 4xx."""
    a = open_session()
    helper = spawn(a, "first task", description="helper")
    url = f"/api/branches/{helper.address}"
    assert api_as(team.member).patch(url, {"internal": True}).status_code == 403
    assert api_as(team.viewer).patch(url, {"internal": True}).status_code == 403
    assert api_as(team.outsider).patch(url, {"internal": True}).status_code == 404
    assert api_as(team.maintainer).patch(url, {"internal": "perhaps"}).status_code == 422
    assert not Branch.objects.get(pk=helper.pk).internal
    assert not Event.objects.filter(type="branch.internal_changed").exists()

    r = api_as(team.maintainer).patch(url, {"internal": True})
    assert r.status_code == 200, r.content
    assert r.json()["internal"] is True and Branch.objects.get(pk=helper.pk).internal
    event = Event.objects.get(session_id=a.sid, type="branch.internal_changed")
    assert event.actor == team.maintainer and event.payload == {"branch": helper.pk, "internal": True}
    assert "helper" not in listed(a, "session")

    # setting it again changes nothing and writes no second event; the owner clears it
    assert api_as(team.maintainer).patch(url, {"internal": True}).json()["internal"] is True
    assert Event.objects.filter(type="branch.internal_changed").count() == 1
    r = api_as(team.owner).patch(url, {"internal": False})
    assert r.status_code == 200 and r.json()["internal"] is False
    last = Event.objects.filter(type="branch.internal_changed").order_by("-seq").first()
    assert last.actor == team.owner and last.payload["internal"] is False
    # an empty patch changes nothing
    assert api_as(team.maintainer).patch(url, {}).status_code == 200
    assert Event.objects.filter(type="branch.internal_changed").count() == 2


def test_the_admin_action_sets_internal_through_the_audited_service(team, open_session,
                                                                                    django_user_model):
    """The admin's "mark internal" / "clear" actions go through the service, so
    each change is a ``branch.internal_changed`` Event with the operator as actor."""
    a = open_session()
    root = django_user_model.objects.create_superuser("root", "root@example.invalid", PASSWORD)
    client = Client()
    client.force_login(root)
    for action, value in (("mark_internal", True), ("unmark_internal", False)):
        r = client.post("/admin/collab/branch/", {"action": action, "_selected_action": [a.branch.pk], "index": 0})
        assert r.status_code == 302, r.content[:1000]
        assert Branch.objects.get(pk=a.branch.pk).internal is value
        event = Event.objects.filter(session_id=a.sid, type="branch.internal_changed").order_by("-seq").first()
        assert event.actor == root and event.payload == {"branch": a.branch.pk, "internal": value}


def test_the_session_page_shows_an_internal_branch_dimmed_with_a_badge(team, open_session,
                                                                                     browser_of):
    """People still see an internal branch in the session page's branch list,
    marked (class ``internal``) with a "hidden from agents" badge; other branches carry neither."""
    a = open_session()
    helper = spawn(a, "first task", description="helper")
    page = lambda: browser_of(team.member).get(reverse("collab:session", args=[a.sid])).content.decode()  # noqa: E731
    assert "hidden from agents" not in page()
    do_set_branch_internal(team.maintainer, helper, True)
    html = page()
    start = html.index(f'id="branch-{helper.pk}"')
    row = html[html.rindex("<li", 0, start): html.index("</li>", start)]
    assert 'class="branch internal' in row and "hidden from agents" in row
    main_start = html.index(f'id="branch-{a.branch.pk}"')
    main_row = html[html.rindex("<li", 0, main_start): html.index("</li>", main_start)]
    assert "internal" not in main_row and "hidden from agents" not in main_row


def test_an_internal_openwork_child_is_not_listed_nor_found_by_task_name(team, scripted_session):
    """The parent's OpenWork ``list_agents`` leaves out an internal
    child, and ``followup_task`` / ``interrupt_agent`` by its task_name answer ``unknown_agent``
    exactly like a name that does not exist; cleared, the child is listed again."""
    api, ow_sid, child = ow_child(scripted_session, team)
    parent = f"{ow_sid}:{Branch.objects.get(session_id=ow_sid, task_name__isnull=True).tip_id}"

    def tool(name, **arguments):
        r = api.post(f"/api/branches/{parent}/tools/{name}", {"arguments": arguments})
        assert r.status_code == 200, r.content
        return r.json()

    assert [r["task_name"] for r in tool("list_agents")["details"]["agents"]] == ["scout"]
    do_set_branch_internal(team.maintainer, child, True)
    assert tool("list_agents")["details"]["agents"] == []
    missing = tool("followup_task", task_name="nobody", message="more")
    assert missing["is_error"] and missing["details"]["code"] == "unknown_agent", missing
    for name, arguments in (("followup_task", {"message": "more"}), ("interrupt_agent", {})):
        body = tool(name, task_name="scout", **arguments)
        assert body["is_error"] and body["details"]["code"] == "unknown_agent", body
    do_set_branch_internal(team.maintainer, child, False)
    assert [r["task_name"] for r in tool("list_agents")["details"]["agents"]] == ["scout"]
