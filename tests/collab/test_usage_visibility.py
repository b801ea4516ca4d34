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
