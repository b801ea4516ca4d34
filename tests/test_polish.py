"""Plots and polish, in-process: the activity feed in sentences with paging, the styled
error pages and the favicon, /api/docs without a CDN, quiet terminal output, the worker's
name, and the server-rendered plots of tokens, cost, latency and agents over time."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.events import send_event_on_commit
from collab.models import Branch, Job, Session
from collab.selectors.activity import MAX_PAGES, PAGE_SIZE, activity_page
from collab.selectors.stats import BUCKETS, job_stats, project_stats, session_stats


def _run_turn(api, sid, prompt="first question"):
    from collab.runtime.loop import run_job

    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]
    run_job(job)  # here, exactly as a worker would
    return job


def _event(sid, type_, payload, actor=None):
    with transaction.atomic():
        return send_event_on_commit(sid, type_, payload, actor=actor)


def _rows(html: str) -> list[str]:
    feed = html[html.index('<ol class="list small events"'):]
    feed = feed[:feed.index("</ol>")]
    return re.findall(r'<li data-seq="(\d+)" data-type="([^"]+)">', feed)


# --- the activity feed ------------------------------------------------------------------


def test_the_activity_feed_tells_what_happened_in_sentences(team, scripted_session, browser_of):
    """Sentences, not event codes: a turn in one line (who asked which agent on which branch, how
    it ended and in how long), which branch was archived and why; streaming chunks never listed;
    the turn's steps, or an event's raw type, seq and payload, sit in a collapsible panel."""
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    job = _run_turn(api, sid)
    _event(sid, "message.delta", {"job": job, "text": "chunk", "call": 1})
    main = Branch.objects.get(session_id=sid, name="main")
    from collab.services.archive import do_archive_branch

    do_archive_branch(main, user=team.member, reason="done <with> it")

    html = browser_of(team.viewer).get(f"/s/{sid}/").content.decode()
    types = [t for _, t in _rows(html)]
    assert "message.delta" not in types and "job.succeeded" not in types and "turn" in types
    assert "member asked <code>bot</code> on" in html
    took = Job.objects.get(pk=job)
    seconds = (took.finished_at - took.started_at).total_seconds()
    assert f"succeeded in {seconds:.1f} s" in html
    assert f'member archived branch <a href="/s/{sid}/?branch={main.pk}">main</a>: done &lt;with&gt; it' in html
    assert "<details><summary><span class=\"sentence\">" in html
    assert "<code>turn</code>" in html and "<code>branch.archived</code>" in html  # the detail, collapsed
    assert "&quot;reason&quot;: &quot;done &lt;with&gt; it&quot;" in html  # the payload JSON, escaped


def test_the_activity_feed_pages_beyond_25_rows_with_an_older_link(team, scripted_session, browser_of):
    """No hard cap: past PAGE_SIZE rows an "older" link (a plain link and an htmx fetch of the
    partial) shows one more page, and the live refresh of that panel keeps it (its URL carries
    ``pages``); no overlap, no gap. Past MAX_PAGES the link jumps by seq (``before``)."""
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    for i in range(2 * PAGE_SIZE + 5):
        _event(sid, "todo.created", {"todo": i, "subject": f"task {i}"}, actor=team.member)
        _event(sid, "message.delta", {"text": "noise"})
    page = browser_of(team.member)
    first = page.get(f"/s/{sid}/activity").content.decode()
    rows = _rows(first)
    assert len(rows) == PAGE_SIZE and all(t == "todo.created" for _, t in rows)
    assert "member added a to-do: task 54" in first
    assert 'href="?pages=2#activity"' in first and f'hx-get="/s/{sid}/activity?pages=2"' in first
    two = page.get(f"/s/{sid}/activity?pages=2", HTTP_HX_REQUEST="true").content.decode()
    assert f'<div id="activity" hx-get="/s/{sid}/activity?pages=2"' in two  # the live refresh keeps both pages
    seqs = [int(s) for s, _ in _rows(two)]
    assert seqs[:PAGE_SIZE] == [int(s) for s, _ in rows]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs) == 2 * PAGE_SIZE
    # the page view takes the same parameters (the link works without script)
    assert _rows(page.get(f"/s/{sid}/?pages=2").content.decode()) == _rows(two)
    # a jump by seq: the rows below it, and a way back to the newest
    below = page.get(f"/s/{sid}/activity?before={seqs[PAGE_SIZE - 1]}").content.decode()
    assert [int(s) for s, _ in _rows(below)] == seqs[PAGE_SIZE:]
    assert "back to the newest" in below
    for bad in ("before=abc", "before=0", "pages=0", f"pages={MAX_PAGES + 1}", "pages=x"):
        assert page.get(f"/s/{sid}/activity?{bad}").status_code == 400, bad


def test_past_the_last_page_size_the_older_link_jumps_by_seq(team, scripted_session):
    from collab.selectors import activity

    _, sid = scripted_session(team.member, [{"text": "answer"}])
    for i in range(12):
        _event(sid, "todo.created", {"todo": i, "subject": f"task {i}"}, actor=team.member)
    session = Session.objects.get(pk=sid)
    page = activity.ActivityPage(rows=[], older=5, pages=activity.MAX_PAGES)
    assert page.older_query == "?before=5"
    assert activity.ActivityPage(rows=[], older=5, pages=2, before=9).older_query == "?before=9&pages=3"
    shown = activity_page(session, team.member, before=10)
    assert [r.seq for r in shown.rows] == list(range(9, 0, -1)) and shown.query == "?before=10"


def test_the_feed_names_no_session_the_viewer_may_not_see(team, scripted_session, browser_of):
    """Session visibility kept: an event about another session (an agent spawned into it) is listed only to
    those who may see that session; nobody else learns its id or name from the feed."""
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    hidden = Session.objects.create(project=team.alpha, title="hidden", visibility="private", created_by=team.member)
    _event(sid, "agent.spawned", {"session": hidden.pk, "name": "secret-agent", "background": True})
    assert "spawned agent <em>secret-agent</em>" in browser_of(team.member).get(f"/s/{sid}/activity").content.decode()
    shown = browser_of(team.viewer).get(f"/s/{sid}/activity").content.decode()
    assert "secret-agent" not in shown and hidden.pk not in shown


def test_a_page_of_activity_costs_the_same_queries_however_long_the_log(team, scripted_session):
    api, sid = scripted_session(team.member, [{"text": "answer"}])
    session = Session.objects.get(pk=sid)

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            activity_page(session, team.member)
        return len(queries)

    _run_turn(api, sid)
    few = count()
    for i in range(3):
        _run_turn(api, sid, f"again {i}")
    assert len(activity_page(session, team.member).rows) == 5  # a line per turn, not per status change
    assert count() == few <= 8  # events, redaction (at most four), branch names, jobs


# --- error pages, favicon, docs, terminal, worker name -----------------------------------


def test_an_unknown_url_answers_the_styled_404_page(team, browser_of, settings):
    settings.DEBUG = False
    for client in (Client(), browser_of(team.member)):
        r = client.get("/no/such/page/")
        assert r.status_code == 404
        html = r.content.decode()
        assert 'id="error-page" data-status="404"' in html
        assert "/static/collab/app.css" in html and 'rel="icon"' in html  # it extends base.html
    # a session one may not see is the same page (never says which)
    r = browser_of(team.outsider).get("/s/nosuchsession/")
    assert r.status_code == 404 and 'data-status="404"' in r.content.decode()


def test_a_forbidden_action_answers_the_styled_403_page(team, scripted_session, browser_of):
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    r = browser_of(team.viewer).post(f"/s/{sid}/turns", {"prompt": "may I?"})
    assert r.status_code == 403
    assert 'id="error-page" data-status="403"' in r.content.decode()


def test_the_500_page_renders_without_a_request_context(db):
    from django.views.defaults import server_error

    r = server_error(RequestFactory().get("/"))
    assert r.status_code == 500 and 'data-status="500"' in r.content.decode()


def test_the_favicon_is_an_svg_linked_from_every_page(team, browser_of):
    html = browser_of(team.member).get("/").content.decode()
    assert '<link rel="icon" href="/static/collab/favicon.svg" type="image/svg+xml">' in html
    r = Client().get("/static/collab/favicon.svg")
    assert r.status_code == 200 and b"<svg" in b"".join(r.streaming_content if r.streaming else [r.content])


def test_favicon_ico_leads_to_the_svg_favicon_not_a_404(db):
    """Browsers ask for /favicon.ico on their own, signed in or not; it is never a 404 in the log."""
    r = Client().get("/favicon.ico")
    assert r.status_code in (301, 302) and r["Location"] == "/static/collab/favicon.svg"
    followed = Client().get("/favicon.ico", follow=True)
    assert followed.status_code == 200


# --- pictures ------------------------------------------------------------------------------


def _jobs(session, spans, *, tokens=100, cost="0.01"):
    """Finished jobs on the session's main branch, one per (start offset s, duration s)."""
    branch = Branch.objects.get(session=session, name="main")
    t0 = timezone.now() - timedelta(hours=2)
    made = []
    for start, duration in spans:
        begun = t0 + timedelta(seconds=start)
        made.append(Job(
            project=session.project, session=session, branch=branch, kind="user", status="succeeded",
            created_at=begun, started_at=begun, finished_at=begun + timedelta(seconds=duration),
            tokens_in=tokens, tokens_out=tokens // 2, cost=Decimal(cost),
        ))
    Job.objects.bulk_create(made)
    return t0


def test_stats_bucket_tokens_cost_latency_and_agents_in_the_database(team, scripted_session):
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    session = Session.objects.get(pk=sid)
    # three overlapping turns at the start, one alone at the end
    _jobs(session, [(0, 600), (60, 600), (120, 600), (6600, 600)])
    stats = session_stats(session)
    assert stats.turns == 4
    plots = {p.key: p for p in stats.plots}
    assert set(plots) == {"tokens", "cost", "latency", "agents"}
    for p in plots.values():
        assert len(p.values) == BUCKETS and len(p.points.split()) == BUCKETS and len(p.dots) == BUCKETS
    assert sum(plots["tokens"].values) == 4 * 150
    assert round(sum(plots["cost"].values), 6) == 0.04
    assert max(plots["latency"].values) == pytest.approx(600, abs=1)
    assert max(plots["agents"].values) == 3 and plots["agents"].values[-1] == 1
    assert plots["tokens"].total == "600"


def test_stats_take_a_constant_number_of_queries(team, scripted_session):
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    session = Session.objects.get(pk=sid)

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            job_stats(Job.objects.filter(session=session), title="x")
        return len(queries)

    _jobs(session, [(0, 30), (100, 30)])
    few = count()
    _jobs(session, [(i * 37, 20 + i) for i in range(60)])
    assert count() == few == 3


def test_the_session_and_project_pages_draw_the_plots_as_svg(team, scripted_session, browser_of):
    """One polyline point per bucket per plot; the title is escaped inside the SVG; the project
    plots count only the sessions the viewer may see."""
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    Session.objects.filter(pk=sid).update(title='<script>alert("x")</script>')
    session = Session.objects.get(pk=sid)
    _jobs(session, [(0, 30), (300, 60)], tokens=1000)

    html = browser_of(team.viewer).get(f"/s/{sid}/").content.decode()
    assert "<script>alert" not in html
    svgs = re.findall(r'<figure class="plot (\w+)" data-plot="\w+" data-buckets="(\d+)">.*?<polyline class="line" points="([^"]*)"/>',
                      html, re.DOTALL)
    assert [k for k, _, _ in svgs] == ["tokens", "cost", "latency", "agents"]
    assert all(int(n) == BUCKETS and len(points.split()) == BUCKETS for _, n, points in svgs)
    assert 'aria-label="Tokens over time in &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"' in html

    private = Session.objects.create(project=team.alpha, title="private", visibility="private", created_by=team.member)
    Branch.objects.create(session=private, name="main", name_stage=3)
    _jobs(private, [(10, 10)], tokens=10_000)
    project_page = browser_of(team.viewer).get("/p/alpha/").content.decode()
    assert 'data-plot="tokens"' in project_page and "3,000" in project_page  # 2 × 1,500, not the private 15,000
    assert project_stats(team.alpha, team.member).turns == 3  # its creator sees all three
    assert project_stats(team.alpha, team.viewer).turns == 2


def test_no_turns_yet_draws_no_plot(team, scripted_session, browser_of):
    _, sid = scripted_session(team.member, [{"text": "answer"}])
    html = browser_of(team.member).get(f"/s/{sid}/").content.decode()
    assert "No turns yet." in html and "<polyline" not in html


# --- /api/docs, terminal output, worker name -----------------------------------------------


def test_api_docs_load_no_cdn_asset_and_no_inline_script(db):
    r = Client().get("/api/docs")
    assert r.status_code == 200
    html = r.content.decode()
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/static/") for s in sources), sources
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", html)
    assert all('type="application/json"' in attrs for attrs in inline), inline  # data, not code
    for asset in sources:
        served = Client().get(asset)
        assert served.status_code == 200, asset


def test_serve_is_quiet_unless_asked(monkeypatch):
    from collab.management.commands.serve import process_commands

    monkeypatch.delenv("TRELLIS_WORKER_LOG_LEVEL", raising=False)
    (worker, worker_env), (web, _) = process_commands("py", "manage.py", "127.0.0.1", 8000, verbose=False)
    assert worker == ["py", "manage.py", "qcluster"] and worker_env == {"TRELLIS_WORKER_LOG_LEVEL": "WARNING"}
    assert web[web.index("-v") + 1] == "0" and "--access-log" not in web  # daphne: no line per request
    (worker, worker_env), (web, _) = process_commands("py", "manage.py", "127.0.0.1", 8000, verbose=True)
    assert worker_env == {} and web[web.index("--access-log") + 1] == "-" and "-v" not in web


def test_the_worker_cluster_has_a_stable_neutral_name_in_the_jobs_worker_format(monkeypatch):
    import os
    import socket
    import uuid
    from types import SimpleNamespace

    import django_q.cluster

    from collab import worker_name

    monkeypatch.setattr(django_q.cluster, "humanize", django_q.cluster.humanize)  # restored afterwards
    assert worker_name.is_worker_process(["manage.py", "qcluster"]) and not worker_name.is_worker_process(["manage.py", "serve"])
    name = worker_name.install()
    assert name == f"trellis-{socket.gethostname()}:{os.getpid()}" == f"trellis-{worker_name.process_name()}"
    for _ in range(3):  # whatever uuid the cluster draws
        assert django_q.cluster.Cluster.name.fget(SimpleNamespace(cluster_id=uuid.uuid4())) == name


def test_no_template_comment_is_shown_to_people():
    """Django's ``{# #}`` comment ends at the line's end: one left open spills its text onto the page
    (a multi-line note at the top of the session page once shifted the whole layout)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "templates"
    spilled = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.html"))
               for n, line in enumerate(path.read_text().splitlines(), 1) if "{#" in line and "#}" not in line]
    assert spilled == [], "use {% comment %} for notes over several lines: " + ", ".join(spilled)
