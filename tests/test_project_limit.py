"""One person owns a bounded number of projects (``TRELLIS_MAX_PROJECTS_PER_USER``): every
project brings its own running cap and quotas, so without the bound one account could claim
any share of the workers by opening projects. Staff are exempt; 0 lifts the bound."""

import threading

import pytest
from django.db import connection

from accounts.models import Membership, Project, Role


def test_a_person_at_the_bound_cannot_open_another_project_and_nothing_is_written(team, api_as, settings):
    settings.TRELLIS_MAX_PROJECTS_PER_USER = 2
    api = api_as(team.member)  # a member of alpha, owner of nothing yet
    assert api.post("/api/projects", {"slug": "one", "name": "One"}).status_code == 201
    assert api.post("/api/projects", {"slug": "two", "name": "Two"}).status_code == 201
    r = api.post("/api/projects", {"slug": "three", "name": "Three"})
    assert r.status_code == 403, r.content
    assert r.json()["code"] == "project_limit_reached" and "TRELLIS_MAX_PROJECTS_PER_USER" in r.json()["detail"]
    assert not Project.objects.filter(slug="three").exists()
    assert Membership.objects.filter(user=team.member, role=Role.OWNER).count() == 2


def test_ownership_of_a_project_counts_however_it_came(team, api_as, settings):
    """The outsider owns beta already (made owner when the team was set up): one more is the bound of 2."""
    settings.TRELLIS_MAX_PROJECTS_PER_USER = 2
    api = api_as(team.outsider)
    assert api.post("/api/projects", {"slug": "gamma", "name": "Gamma"}).status_code == 201
    assert api.post("/api/projects", {"slug": "delta", "name": "Delta"}).json()["code"] == "project_limit_reached"


def test_staff_are_exempt_and_zero_lifts_the_bound(team, api_as, settings):
    settings.TRELLIS_MAX_PROJECTS_PER_USER = 1
    team.member.is_staff = True
    team.member.save(update_fields=["is_staff"])
    api = api_as(team.member)
    assert [api.post("/api/projects", {"slug": f"s{n}", "name": "S"}).status_code for n in range(3)] == [201] * 3
    settings.TRELLIS_MAX_PROJECTS_PER_USER = 0
    other = api_as(team.viewer)
    assert [other.post("/api/projects", {"slug": f"v{n}", "name": "V"}).status_code for n in range(3)] == [201] * 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent transactions: PostgreSQL's row locks")
def test_two_creations_at_once_cannot_both_take_the_last_place(transactional_db, make_user, settings):
    from accounts.services import ProjectLimitReached, create_project

    settings.TRELLIS_MAX_PROJECTS_PER_USER = 1
    user = make_user("racer")
    for round_ in range(10):
        Project.objects.filter(memberships__user=user).delete()
        outcomes, start = [], threading.Barrier(2)

        def create(slug):
            start.wait()
            try:
                create_project(user, slug=slug, name=slug)
                outcomes.append("created")
            except ProjectLimitReached:
                outcomes.append("refused")
            finally:
                connection.close()

        threads = [threading.Thread(target=create, args=(f"race-{round_}-{n}",)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["created", "refused"], (round_, outcomes)
        assert Membership.objects.filter(user=user, role=Role.OWNER).count() == 1
