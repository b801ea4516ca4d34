"""The numbers a member reads about a project cover only the sessions they may see: a private
session's spending shows in the project's usage for those who see the session (its creator,
maintainers and owners), not for the other members."""

from decimal import Decimal

from collab.models import Job


def test_a_projects_usage_leaves_out_the_sessions_the_reader_may_not_see(team, scripted_session, api_as, run_queued):
    owner_api, private = scripted_session(team.owner, [{"text": "secret work"}], agent_id="bot")
    assert owner_api.patch(f"/api/sessions/{private}", {"visibility": "private"}).status_code == 200
    member_api, shared = scripted_session(team.member, [{"text": "team work"}], agent_id="bot2")
    for api, sid in ((owner_api, private), (member_api, shared)):
        assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
    run_queued()
    Job.objects.filter(session_id=private).update(tokens_in=100, tokens_out=50, cost=Decimal("5"))
    Job.objects.filter(session_id=shared).update(tokens_in=10, tokens_out=5, cost=Decimal("1"))

    def usage(user):
        r = api_as(user).get("/api/projects/alpha")
        assert r.status_code == 200, r.content
        u = r.json()["usage"]
        return u["tokens_in"], u["tokens_out"], Decimal(u["cost"])

    assert usage(team.member) == (10, 5, Decimal("1"))  # the owner's private session is not theirs to see
    assert usage(team.viewer) == (10, 5, Decimal("1"))
    assert usage(team.owner) == (110, 55, Decimal("6"))
    assert usage(team.maintainer) == (110, 55, Decimal("6"))  # maintainers see every session


def test_the_project_and_home_pages_count_only_the_sessions_the_reader_may_see(team, scripted_session, api_as,
                                                                               run_queued):
    """The project page's session count and its plots' totals (turns, tokens, cost), and the
    home page, leave a private session out for a member; its creator's pages count it."""
    import re

    from tests.collab.test_authorization import logged_in

    owner_api, private = scripted_session(team.owner, [{"text": "secret work"}], agent_id="bot")
    assert owner_api.patch(f"/api/sessions/{private}", {"visibility": "private"}).status_code == 200
    member_api, shared = scripted_session(team.member, [{"text": "team work"}], agent_id="bot2")
    for api, sid in ((owner_api, private), (owner_api, private), (member_api, shared)):
        assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
        run_queued()
    Job.objects.filter(session_id=private).update(tokens_in=700, tokens_out=300, cost=Decimal("9"))

    def numbers(user):
        page = logged_in(user).get("/p/alpha/").content.decode()
        count = int(re.search(r'id="session-count">(\d+)<', page).group(1))
        totals = re.findall(r'<span class="total">([^<]*)</span>', page)
        return count, totals

    member_count, member_totals = numbers(team.member)
    owner_count, owner_totals = numbers(team.owner)
    assert (member_count, owner_count) == (1, 2)
    assert member_totals and member_totals != owner_totals
    assert not any("700" in t or "1,000" in t or "1.0k" in t for t in member_totals), member_totals
    home = logged_in(team.member).get("/").content.decode()
    assert "secret work" not in home and private not in home
