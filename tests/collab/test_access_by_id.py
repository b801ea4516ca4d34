"""A session or execution looked up by id decides with the same rule as the listings
(docs/contract.md#visibility).

``collab.access.access_session`` / ``access_job`` read the row and the caller's standing in it
(accepted project role, share of the root session) in one statement and decide in Python
(``_effective_role``, ``session_role``'s rule); listings filter with the ``visible_sessions``
queryset. Over every kind of person (each role, a pending invitee, a deactivated member, an
outsider, the creator) and every kind of session (project-wide, private, shared with or without
them, with a narrower or wider share, and a child session of each), the two must give the same
answer — and a session one may not see must cost exactly what a missing id costs.
"""

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership
from collab.access import access_job, access_session, session_role, visible_sessions
from collab.errors import Forbidden, NotFound
from collab.models import AgentSpec, Session, SessionShare, Visibility
from collab.models.ids import new_id
from collab.services.sessions import do_create_session
from collab.services.turns import do_start_user_turn

PEOPLE = ("owner", "maintainer", "member", "viewer", "pending", "inactive", "outsider", "creator")


@pytest.fixture
def world(db, make_user):
    from accounts.models import Project

    alpha = Project.objects.create(slug="alpha", name="Alpha")
    users = {name: make_user(name) for name in PEOPLE}
    for name, role in (("owner", "owner"), ("maintainer", "maintainer"), ("member", "member"),
                       ("viewer", "viewer"), ("inactive", "member"), ("creator", "member")):
        Membership.objects.create(user=users[name], project=alpha, role=role)
    Membership.objects.create(user=users["pending"], project=alpha, role="member", accepted_at=None)
    users["inactive"].is_active = False
    users["inactive"].save()
    AgentSpec.objects.create(project=alpha, agent_id="bot", script=[{"text": "ok"}])
    sessions = {}
    for visibility, share in ((Visibility.PROJECT, None), (Visibility.PRIVATE, None), (Visibility.SHARED, None),
                              (Visibility.SHARED, "viewer"), (Visibility.SHARED, "maintainer")):
        root = do_create_session(users["creator"], alpha, title="t", agent_id="bot")
        Session.objects.filter(pk=root.pk).update(visibility=visibility)
        if share:
            for name in ("member", "viewer", "pending", "inactive"):
                SessionShare.objects.create(session_id=root.pk, user=users[name], role=share)
        child = Session.objects.create(id=new_id(), project=alpha, title="child", parent_session_id=root.pk,
                                       agent_role="explorer", created_by=users["member"])
        sessions[f"{visibility}/{share}"] = root.pk
        sessions[f"{visibility}/{share}/child"] = child.pk
    jobs = {label: do_start_user_turn(users["creator"], Session.objects.get(pk=sid), "hi").pk
            for label, sid in sessions.items() if not label.endswith("/child")}
    return users, sessions, jobs


def test_a_lookup_by_id_answers_as_the_listing_does_for_everyone(world):
    users, sessions, jobs = world
    for (name, user), (label, sid) in itertools.product(users.items(), sessions.items()):
        listed = visible_sessions(user).filter(pk=sid).exists()
        try:
            found = access_session(user, sid)
        except NotFound:
            found = None
        assert (found is not None) == listed, (name, label)
        if found is not None:
            assert session_role(user, Session.objects.get(pk=sid)) is not None, (name, label)
        if label in jobs:
            try:
                job = access_job(user, jobs[label])
            except NotFound:
                job = None
            assert (job is not None) == listed, (name, label)
    # a sanity check on the matrix itself: each kind of answer occurs
    assert not visible_sessions(users["outsider"]).exists()
    assert visible_sessions(users["member"]).filter(pk=sessions["shared/viewer"]).exists()
    assert not visible_sessions(users["member"]).filter(pk=sessions["shared/None"]).exists()
    assert visible_sessions(users["maintainer"]).filter(pk=sessions["private/None"]).exists()


def test_a_share_narrows_the_role_a_lookup_by_id_checks(world):
    users, sessions, _ = world
    member = users["member"]
    # a viewer share: the member may read the session, not start a turn in it
    assert access_session(member, sessions["shared/viewer"]).pk == sessions["shared/viewer"]
    with pytest.raises(Forbidden):
        access_session(member, sessions["shared/viewer"], "turn.start")
    # a maintainer share never widens a member's project role
    with pytest.raises(Forbidden):
        access_session(member, sessions["shared/maintainer"], "runtime.control")
    assert access_session(member, sessions["shared/maintainer"], "turn.start")
    # a child session follows its root's share
    assert access_session(member, sessions["shared/viewer/child"]).pk == sessions["shared/viewer/child"]


def test_a_session_one_may_not_see_costs_what_a_missing_id_costs(world):
    users, sessions, _ = world
    member = users["member"]
    with CaptureQueriesContext(connection) as hidden:
        with pytest.raises(NotFound):
            access_session(member, sessions["private/None"])
    with CaptureQueriesContext(connection) as missing:
        with pytest.raises(NotFound):
            access_session(member, "000000000000")
    with CaptureQueriesContext(connection) as seen:
        access_session(member, sessions["project/None"], "turn.start")
    assert len(hidden) == len(missing) == len(seen) == 1
