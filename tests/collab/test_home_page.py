"""The home page (docs/web-app.md#the-home-page): across a person's projects, in the sessions they
may see, what runs now and what ended since their previous visit, in a bounded number of queries."""

import re

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Membership, Profile
from collab.models import Job
from collab.runtime.loop import run_job


def _home(client: Client) -> str:
    r = client.get("/")
    assert r.status_code == 200
    return r.content.decode()


def _section(html: str, name: str) -> str:
    return html[html.index(f'<section id="{name}"'):].split("</section>", 1)[0]


def _jobs(html: str, name: str) -> list[tuple[str, str]]:
    return re.findall(r'<li data-job="([0-9a-f]+)" data-status="([a-z]+)">', _section(html, name))


def _start(api, sid, prompt="go") -> str:
    return api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]


def test_the_home_page_shows_what_runs_then_what_ended_since_the_last_visit(team, scripted_session, browser_of):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    home = browser_of(team.member)
    first = _home(home)
    assert "Nothing running." in first and "Nothing finished in the last day." in first
    assert Profile.objects.get(user=team.member).last_home_visit is not None
    assert "Nothing new since your last visit." in _home(home)

    job = _start(api, sid)
    queued = _home(home)
    assert _jobs(queued, "running") == [(job, "queued")] and _jobs(queued, "finished") == []
    line = _section(queued, "running")
    assert "member asked <code>bot</code> on" in line and f'href="/s/{sid}/?branch=' in line and "queued for" in line
    assert f'in session <a href="/s/{sid}/">test</a>' in line

    run_job(job)
    ended = _home(home)
    assert "Nothing running." in ended
    assert _jobs(ended, "finished") == [(job, "succeeded")]
    assert "succeeded in" in _section(ended, "finished") and "Finished since your last visit" in ended
    again = _home(home)
    assert _jobs(again, "finished") == [] and "Nothing new since your last visit." in again


def test_the_home_page_lists_only_sessions_the_person_may_see(team, scripted_session, browser_of):
    """A colleague's private session and another project's session stay off the home page; the
    viewer of the project sees the member's project-wide session."""
    api, open_sid = scripted_session(team.member, [{"text": "answer"}])
    private_sid = api.post("/api/projects/alpha/sessions", {"title": "mine alone", "agent_id": "bot"}).json()["id"]
    assert api.patch(f"/api/sessions/{private_sid}", {"visibility": "private"}).status_code == 200
    beta_api, beta_sid = scripted_session(team.outsider, [{"text": "answer"}], project="beta")
    shown, hidden, elsewhere = _start(api, open_sid), _start(api, private_sid), _start(beta_api, beta_sid)
    viewer = _home(browser_of(team.viewer))
    assert [j for j, _ in _jobs(viewer, "running")] == [shown]
    assert hidden not in viewer and private_sid not in viewer and "mine alone" not in viewer and elsewhere not in viewer
    assert {j for j, _ in _jobs(_home(browser_of(team.member)), "running")} == {shown, hidden}
    Membership.objects.filter(user=team.viewer).delete()
    assert _jobs(_home(browser_of(team.viewer)), "running") == []


def test_the_home_page_costs_the_same_queries_however_many_turns(team, scripted_session, browser_of,
                                                                django_assert_max_num_queries):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    home = browser_of(team.member)
    _home(home)  # the first visit writes the profile row

    def count() -> tuple[int, str]:
        Job.objects.filter(status="succeeded").update(finished_at=timezone.now())  # ended since the last visit
        with CaptureQueriesContext(connection) as queries:
            html = _home(home)
        return len(queries), html

    run_job(_start(api, sid))
    _start(api, sid, "waits")
    few, _ = count()
    for i in range(4):
        other = api.post("/api/projects/alpha/sessions", {"title": f"more {i}", "agent_id": "bot"}).json()["id"]
        run_job(_start(api, other))
        _start(api, other, "waits")
    many, html = count()
    assert len(_jobs(html, "running")) == 5 and len(_jobs(html, "finished")) == 5
    assert many == few, (few, many)
    print(f"home page: {many} queries")
    with django_assert_max_num_queries(10):
        _home(home)
