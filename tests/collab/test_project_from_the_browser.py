"""A project is created in the browser: the projects page's "New project" form posts to
``/projects/new``, which calls the service of ``POST /api/projects`` (its slug rules, its
per-person limit). Every new project — page or API — starts with working agents, the scripted
``assistant`` that asks its sub-agents ``researcher`` and ``critic`` and sums up their results; a
project without any agent says so on its page instead of offering an empty menu."""

import re

import pytest
from django.test import Client, override_settings
from django.utils.html import escape

from accounts.models import Membership, Project, Role
from collab.models import AgentSpec, Branch, Event, Job
from collab.services.projects import (
    CRITIC_AGENT_ID,
    RESEARCHER_AGENT_ID,
    STARTER_AGENT_ID,
    STARTER_SPEC,
    STARTER_SPECS,
    slug_from_name,
)
from collab.services.specs import do_delete_agent_spec
from collab.selectors.specs import spec_by_agent_id

PASSWORD = "pw-secret-123"


def counts() -> tuple[int, int, int, int]:
    return Project.objects.count(), Membership.objects.count(), AgentSpec.objects.count(), Event.objects.count()


def form_error(html: str, field: str) -> str:
    found = re.search(rf'id="new-project-{field}-error"[^>]*>([^<]*)<', html)
    assert found, f"no error shown for {field}"
    return found.group(1)


def test_the_projects_page_offers_a_new_project_form(team, browser_of):
    html = browser_of(team.member).get("/").content.decode()
    assert 'id="new-project-form"' in html and 'action="/projects/new"' in html
    assert 'name="csrfmiddlewaretoken"' in html and 'name="name"' in html and 'name="slug"' in html
    assert browser_of(team.member).get("/projects/new").status_code == 200  # the same page
    assert Client().get("/projects/new")["Location"].startswith("/accounts/login/")


def test_creating_a_project_on_the_page_lands_on_it_with_its_creator_as_owner_and_the_starter_agent(team, browser_of):
    page = browser_of(team.member)
    r = page.post("/projects/new", {"name": "Gamma Team", "slug": ""})
    assert r.status_code == 302 and r["Location"] == "/p/gamma-team/", r.content[:500]
    project = Project.objects.get(slug="gamma-team")
    assert project.name == "Gamma Team"
    owner = Membership.objects.get(project=project)
    assert (owner.user, owner.role) == (team.member, Role.OWNER) and owner.accepted_at is not None
    specs = AgentSpec.objects.filter(project=project).order_by("agent_id")
    assert [(s.agent_id, s.provider, s.connection_id) for s in specs] == [
        (STARTER_AGENT_ID, "scripted", None), (CRITIC_AGENT_ID, "scripted", None), (RESEARCHER_AGENT_ID, "scripted", None)]
    created = Event.objects.filter(project=project, type="agent_spec.created").order_by("id")
    assert {e.actor for e in created} == {team.member}
    assert [e.payload for e in created] == [{"agent_id": spec["agent_id"]} for spec in STARTER_SPECS]

    html = page.get(r["Location"]).content.decode()
    assert f'<option value="{STARTER_AGENT_ID}">' in html and 'id="no-agent"' not in html
    assert "/p/gamma-team/" in page.get("/").content.decode()


def test_a_chosen_slug_is_kept_and_a_name_without_one_derives_it(team, browser_of):
    page = browser_of(team.member)
    assert page.post("/projects/new", {"name": "Anything", "slug": "my-slug"})["Location"] == "/p/my-slug/"
    assert slug_from_name("Café Ünïcode_Team!") == "cafe-unicode-team"
    assert slug_from_name("--x--") == "x" and slug_from_name("日本語") == ""
    assert len(slug_from_name("word " * 40)) <= 64 and not slug_from_name("word " * 40).endswith("-")


def test_the_starter_agent_asks_a_researcher_and_a_critic_and_sums_up_their_results(team, browser_of, run_queued):
    """A new project's first session shows multi-agent work at once: the person's turn starts the
    researcher, then the critic on the researcher's notes (each a branch of the session, its answer
    the result of the ``agent`` call), and the answer sums up both and says how to add a real model."""
    page = browser_of(team.member)
    assert page.post("/projects/new", {"name": "Gamma"}).status_code == 302
    r = page.post("/p/gamma/sessions", {"title": "first", "agent_id": STARTER_AGENT_ID})
    assert r.status_code == 302
    sid = r["Location"].strip("/").split("/")[1]
    assert page.post(f"/s/{sid}/turns", {"prompt": "hello there"}).status_code == 302
    run_queued()

    jobs = list(Job.objects.filter(session_id=sid).select_related("branch").order_by("created_at"))
    assert [(j.kind, j.status, j.branch.name) for j in jobs] == [
        ("user", "succeeded", "main"), ("spawn", "succeeded", RESEARCHER_AGENT_ID), ("spawn", "succeeded", CRITIC_AGENT_ID)]
    turn, researcher, critic = jobs
    assert researcher.parent_job_id == critic.parent_job_id == turn.pk
    assert "hello there" in researcher.result and researcher.result in critic.result  # the critic read the notes
    assert critic.result in turn.result and "researcher" in turn.result and "critic" in turn.result
    assert "scripted demo agents" in turn.result
    assert "model connection" in turn.result and "Agent specs page" in turn.result
    assert Branch.objects.filter(session_id=sid).count() == 3
    html = page.get(f"/s/{sid}/").content.decode()
    assert escape("I asked two sub-agents about “hello there”") in html
    for name in (RESEARCHER_AGENT_ID, CRITIC_AGENT_ID):
        assert escape(name) in html


@pytest.mark.parametrize("slug", ["Not A Slug", "-leading", "under_score", "a" * 65])
def test_a_bad_slug_re_renders_the_form_with_the_error_and_creates_nothing(team, browser_of, slug):
    before = counts()
    r = browser_of(team.member).post("/projects/new", {"name": "Gamma", "slug": slug})
    assert r.status_code == 400
    html = r.content.decode()
    assert 'id="new-project-form"' in html and "slug must be" in form_error(html, "slug")
    assert f'value="{escape(slug)}"' in html and 'value="Gamma"' in html  # what was typed, to correct
    assert counts() == before


def test_a_name_that_gives_no_slug_asks_for_one(team, browser_of):
    before = counts()
    r = browser_of(team.member).post("/projects/new", {"name": "日本語"})
    assert r.status_code == 400 and "choose one" in form_error(r.content.decode(), "slug")
    assert counts() == before


@pytest.mark.parametrize("fields", [{"name": "Mine now", "slug": "beta"}, {"name": "Alpha"}], ids=["chosen", "derived"])
def test_a_taken_slug_re_renders_the_form_with_the_error_and_creates_nothing(team, browser_of, fields):
    before = counts()
    r = browser_of(team.member).post("/projects/new", fields)
    assert r.status_code == 409
    assert "already exists" in form_error(r.content.decode(), "slug")
    assert counts() == before
    assert Project.objects.get(slug="beta").name == "Beta"
    assert not Membership.objects.filter(user=team.member, project__slug="beta").exists()


@override_settings(TRELLIS_MAX_PROJECTS_PER_USER=1)
def test_past_the_project_limit_the_page_says_so_and_creates_nothing(team, browser_of):
    """The outsider owns beta already: one project is their limit."""
    before = counts()
    r = browser_of(team.outsider).post("/projects/new", {"name": "Gamma"})
    assert r.status_code == 403
    html = r.content.decode()
    error = re.search(r'id="new-project-error"[^>]*>([^<]*)<', html).group(1)
    assert "you already own 1 project" in error and "TRELLIS_MAX_PROJECTS_PER_USER" in error
    assert 'id="new-project-form"' in html and 'value="Gamma"' in html
    assert counts() == before


def test_the_new_project_form_needs_the_csrf_token(team):
    browser = Client(enforce_csrf_checks=True)
    browser.get("/accounts/login/")
    token = browser.cookies["csrftoken"].value
    assert browser.post("/accounts/login/", {"username": "member", "password": PASSWORD,
                                             "csrfmiddlewaretoken": token}).status_code == 302
    before = counts()
    assert browser.post("/projects/new", {"name": "Gamma"}).status_code == 403
    assert counts() == before
    token = browser.cookies["csrftoken"].value  # rotated at login
    r = browser.post("/projects/new", {"name": "Gamma", "csrfmiddlewaretoken": token})
    assert r.status_code == 302 and r["Location"] == "/p/gamma/"


def test_a_project_created_through_the_api_gets_the_starter_agent_too(team, api_as):
    api = api_as(team.member)
    r = api.post("/api/projects", {"slug": "gamma", "name": "Gamma"})
    assert r.status_code == 201, r.content
    spec = spec_by_agent_id(Project.objects.get(slug="gamma").pk, STARTER_AGENT_ID)
    assert spec.provider == "scripted" and spec.script == STARTER_SPEC["script"]
    created = Event.objects.filter(project__slug="gamma", type="agent_spec.created")
    assert sorted(e.payload["agent_id"] for e in created) == sorted(spec["agent_id"] for spec in STARTER_SPECS)
    assert {e.actor for e in created} == {team.member}
    r = api.post("/api/projects/gamma/sessions", {"title": "t", "agent_id": STARTER_AGENT_ID})
    assert r.status_code == 201 and r.json()["agent_id"] == STARTER_AGENT_ID
    taken = api.post("/api/projects", {"slug": "gamma", "name": "Again"})
    assert taken.status_code == 409 and taken.json()["code"] == "slug_taken" and taken.json()["field"] == "slug"


def test_a_project_without_an_agent_says_so_instead_of_an_empty_menu(team, browser_of):
    """Alpha has no agent spec: those who may create one get the link, the others are told whom to ask;
    there is no agent menu and the button is disabled."""
    for user, says in ((team.owner, "create one on the"), (team.maintainer, "create one on the"),
                       (team.member, "ask a maintainer"), (team.viewer, "ask a maintainer")):
        html = browser_of(user).get("/p/alpha/").content.decode()
        assert "This project has no agent yet" in html and says in html, user
        assert ('href="/p/alpha/specs"' in html) == (says == "create one on the"), user
        form = re.search(r'<form[^>]*id="new-session-form".*?</form>', html, re.S).group(0)
        assert "<select" not in form and 'name="agent_id"' not in form
        assert re.search(r"<button[^>]*\bdisabled\b[^>]*>New session</button>", form)
        assert "default agent" not in html


def test_deleting_the_starter_agents_leaves_the_no_agent_message(team, browser_of):
    page = browser_of(team.member)
    page.post("/projects/new", {"name": "Gamma"})
    project = Project.objects.get(slug="gamma")
    for spec in STARTER_SPECS:
        do_delete_agent_spec(team.member, spec_by_agent_id(project.pk, spec["agent_id"]))
    html = page.get("/p/gamma/").content.decode()
    assert "This project has no agent yet" in html and 'href="/p/gamma/specs"' in html  # its owner may create one
    assert "<select" not in re.search(r'<form[^>]*id="new-session-form".*?</form>', html, re.S).group(0)
