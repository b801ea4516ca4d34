"""``manage.py demo`` (docs/web-app.md#projects-and-their-first-session): the demo project holds a
finished multi-agent session — sub-agents with their results, a person's fork, an archived branch —
made by really running its turns in the command, with no worker, on the database under test; and
made once, however often the command runs (``manage.py serve`` runs it at every start)."""

import time
from io import StringIO

from django.core.management import call_command
from django.test import Client
from django.utils.html import escape

from collab.management.commands.demo import DEMO_QUESTION, DEMO_TITLE, FORK_ARCHIVED_BECAUSE, FORK_NAME, FORK_QUESTION
from collab.models import AgentSpec, Branch, Job, Session
from collab.services.projects import CRITIC_AGENT_ID, RESEARCHER_AGENT_ID, STARTER_SPECS


def test_the_demo_project_holds_a_finished_multi_agent_session_made_once(db, settings, tmp_path, run_queued,
                                                                          django_user_model):
    settings.VAR_DIR = tmp_path
    started = time.monotonic()
    call_command("demo", "--quiet", stdout=StringIO())
    took = time.monotonic() - started
    assert took < 15, f"the demo took {took:.1f}s"  # scripted steps of 0.1 s: a second or two

    assert sorted(AgentSpec.objects.filter(project__slug="demo").values_list("agent_id", flat=True)) == sorted(
        spec["agent_id"] for spec in STARTER_SPECS)
    session = Session.objects.get(project__slug="demo", title=DEMO_TITLE)
    jobs = list(Job.objects.filter(session=session).select_related("branch").order_by("created_at"))
    assert [(j.kind, j.status, j.branch.name) for j in jobs] == [
        ("user", "succeeded", "main"),
        ("spawn", "succeeded", RESEARCHER_AGENT_ID), ("spawn", "succeeded", CRITIC_AGENT_ID),
        ("user", "succeeded", FORK_NAME),
        ("spawn", "succeeded", RESEARCHER_AGENT_ID), ("spawn", "succeeded", CRITIC_AGENT_ID),
    ]
    asked, researched, reviewed, forked, *_ = jobs
    assert DEMO_QUESTION in researched.result and researched.result in reviewed.result in asked.result
    assert FORK_QUESTION in forked.result

    main, fork = asked.branch, forked.branch
    assert fork.forked_from_id == main.tip_id  # forked from main's answer
    assert fork.archived_at is not None and fork.archive_reason == FORK_ARCHIVED_BECAUSE
    assert not Branch.objects.filter(session=session).exclude(pk=fork.pk).filter(archived_at__isnull=False).exists()
    assert run_queued() == []  # nothing is left for a worker

    page = Client()
    page.force_login(django_user_model.objects.get(username="demo"))
    html = page.get(f"/s/{session.pk}/").content.decode()
    assert escape(DEMO_QUESTION) in html and escape(FORK_NAME) in html
    assert escape(RESEARCHER_AGENT_ID) in html and escape(CRITIC_AGENT_ID) in html

    call_command("demo", "--quiet", stdout=StringIO())  # again: the same session, nothing new
    assert Session.objects.filter(project__slug="demo").count() == 1
    assert Job.objects.filter(session__project__slug="demo").count() == len(jobs)
    assert AgentSpec.objects.filter(project__slug="demo").count() == len(STARTER_SPECS)
