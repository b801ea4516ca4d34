"""The session DAG from stored rows, in process: lanes chosen when a
branch opens, the fork / spawn / delegation / result edges of a real scripted session, keyset
pages with a constant number of queries, visibility of other sessions, and replay."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from collab.models import Branch, Job, Message, Session
from collab.selectors.dag import DAG_QUERIES, PAGE_ROWS, dag_page


def _run(job_id):
    from collab.runtime.loop import run_job

    assert run_job(job_id) == "succeeded"


def _deliver(branch):
    """What the worker does after a child's completion commits: settle the owed result as a follow-up."""
    from collab.services.followup import deliver_owed

    (followup,) = deliver_owed(branch.pk)
    _run(followup.pk)
    return followup


SCRIPT = {"user": [{"text": "answer"}], "spawn": [{"text": "scout report"}], "task": [{"text": "task done"}],
          "followup": [{"text": "thanks"}]}


@pytest.fixture
def story(team, scripted_session):
    """A session with a fork (archived), a background spawn and a delegation, each result back on main."""
    from collab.gateway import run_as_branch
    from collab.services.archive import do_archive_branch
    from collab.services.turns import do_fork_and_start

    api, sid = scripted_session(team.member, SCRIPT)
    _run(api.post(f"/api/sessions/{sid}/turns", {"prompt": "first question"}).json()["execution_id"])
    main = Branch.objects.get(session_id=sid, name="main")
    p1, a1 = main.tip.predecessor, main.tip
    run_as_branch(team.member, main.address, "agent", {"prompt": "scout things", "description": "scout",
                                                       "run_in_background": True})
    spawn = Job.objects.get(session_id=sid, kind="spawn")
    _run(spawn.pk)
    _deliver(main)
    session = Session.objects.get(pk=sid)
    fork = do_fork_and_start(team.member, session, p1, "Try the other approach")
    _run(fork.pk)
    main.refresh_from_db()
    scout = Branch.objects.get(pk=spawn.branch_id)
    run_as_branch(team.member, main.address, "agent", {"to": scout.address, "prompt": "check one more thing"})
    task = Job.objects.get(session_id=sid, kind="task")
    _run(task.pk)
    _deliver(main)
    do_archive_branch(Branch.objects.get(pk=fork.branch_id), user=team.member, reason="dead end")
    return type("Story", (), {"api": api, "sid": sid, "main": main, "p1": p1, "a1": a1, "spawn": spawn,
                              "fork": Branch.objects.get(pk=fork.branch_id), "scout": scout, "task": task})


def _edges(graph):
    return {(e["kind"], e["detail"], e["from"], e["to"]) for e in graph.edges}


def test_every_branch_gets_the_free_lane_nearest_its_parent_when_it_opens(story, team):
    from collab.services.turns import do_fork_and_start

    lanes = dict(Branch.objects.filter(session_id=story.sid).values_list("name", "lane"))
    assert lanes["main"] == 0 and lanes["scout"] == 1 and story.fork.lane == 2
    # the archived, idle fork's lane is free again: the next fork from main takes it (nearest free to 0 is 2)
    session = Session.objects.get(pk=story.sid)
    again = do_fork_and_start(team.member, session, story.p1, "A third way")
    assert Branch.objects.get(pk=again.branch_id).lane == 2
    # while a branch has an open turn its lane stays taken, even archived
    later = do_fork_and_start(team.member, session, story.p1, "A fourth way")
    assert Branch.objects.get(pk=later.branch_id).lane == 3
    # a spawn opens beside the branch that called it, not at the lowest free lane (1, once scout is archived)
    from collab.gateway import run_as_branch
    from collab.services.archive import do_archive_branch

    _run(later.pk)
    do_archive_branch(Branch.objects.get(pk=story.scout.pk), user=team.member, reason="done")
    run_as_branch(team.member, Branch.objects.get(pk=later.branch_id).address, "agent",
                  {"prompt": "look", "description": "helper", "run_in_background": True})
    assert Branch.objects.get(session_id=story.sid, name="helper").lane == 4


def test_the_graph_has_forks_spawns_delegations_results_and_an_archived_lane(story, team):
    graph = dag_page(Session.objects.get(pk=story.sid), team.member)["graph"]
    nodes = {n["id"]: n for n in graph.nodes}
    rows = list(Message.objects.filter(session_id=story.sid).exclude(kind="attach").order_by("created_at", "id"))
    assert [n["id"] for n in graph.nodes] == [m.pk for m in rows]  # one row per message, oldest on top
    first = {b: next(m for m in rows if m.branch_id == b) for b in (story.scout.pk, story.fork.pk)}
    followups = list(Job.objects.filter(session_id=story.sid, kind="followup").order_by("created_at"))
    task_prompt = Job.objects.get(pk=story.task.pk).prompt_msg_id
    scout_rows = [m.pk for m in rows if m.branch_id == story.scout.pk]
    edges = _edges(graph)
    assert ("fork", "", story.p1.pk, first[story.fork.pk].pk) in edges
    assert ("spawn", "spawn", story.a1.pk, first[story.scout.pk].pk) in edges
    assert ("result", "succeeded", scout_rows[1], followups[0].prompt_msg_id) in edges
    assert ("spawn", "task", story.task.caller_msg_id, task_prompt) in edges
    assert ("result", "succeeded", scout_rows[-1], followups[1].prompt_msg_id) in edges
    assert len(edges) == 5
    assert nodes[story.p1.pk]["fork_point"]
    fork_nodes = [n for n in graph.nodes if n["branch"] == story.fork.pk]
    assert fork_nodes and all(n["archived"] and n["reason"] == "dead end" for n in fork_nodes)
    assert {n["lane"] for n in fork_nodes} == {2}
    # every node links to the reading view of its branch at itself
    assert nodes[story.a1.pk]["href"] == f"/s/{story.sid}/?branch={story.main.pk}&head={story.a1.pk}"


def test_the_page_renders_the_svg_with_data_attributes(story, team):
    client = Client()
    client.force_login(team.viewer)
    html = client.get(f"/s/{story.sid}/").content.decode()
    assert 'id="dag"' in html and "<svg" in html
    assert html.count('data-edge="fork"') == 1 and html.count('data-edge="result"') == 2
    assert f'data-node="{story.a1.pk}"' in html and 'data-archived="1"' in html and "dead end" in html
    part = client.get(f"/s/{story.sid}/dag", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div class="dag-page" id="dag-live"') and "<svg" in part


def test_a_running_branch_is_marked_live(story, team):
    r = story.api.post(f"/api/sessions/{story.sid}/turns", {"prompt": "more", "branch": "scout"})
    assert r.status_code == 202, r.content
    graph = dag_page(Session.objects.get(pk=story.sid), team.member)["graph"]
    live = [n for n in graph.nodes if n["live"]]
    assert [(n["branch"], n["live"]) for n in live] == [(story.scout.pk, "queued")]
    assert [s["live"] for s in graph.segments if s["branch"] == story.scout.pk] == ["queued"]


def _big_session(team, n_messages, n_branches, *, title="big"):
    """A session of ``n_messages`` rows over ``n_branches`` branches (forks off main), written in
    bulk with increasing timestamps, plus call and result edges every few rows."""
    from collab.services.sessions import do_create_session

    session = do_create_session(team.member, team.alpha, title=title)
    main = session.branches.get()
    t0 = timezone.now() - timedelta(days=1)
    branches = [main]
    for i in range(1, n_branches):
        branches.append(Branch.objects.create(session=session, name=f"b{i}", lane=i, name_stage=3))
    tips, rows = {}, []
    for i in range(n_messages):
        b = branches[i % n_branches]
        pred = tips.get(b.pk) or (tips.get(main.pk) if b is not main else None)
        m = Message(session=session, branch=b, role="user" if i % 2 else "assistant", text=f"row {i} " * 5,
                    predecessor=pred, depth=(pred.depth + 1) if pred else 0, created_at=t0 + timedelta(seconds=i))
        rows.append(m)
        tips[b.pk] = m
    Message.objects.bulk_create(rows, batch_size=1000)
    for b in branches[1:]:
        first = next(m for m in rows if m.branch_id == b.pk)
        Branch.objects.filter(pk=b.pk).update(forked_from=first.predecessor, tip=tips[b.pk])
    Branch.objects.filter(pk=main.pk).update(tip=tips[main.pk])
    jobs = []
    for i in range(0, n_messages - n_branches, 7):  # a call from row i to the next row of another branch
        caller, target = rows[i], rows[i + 1]
        jobs.append(Job(project=team.alpha, session=session, branch=target.branch, kind="task", status="succeeded",
                        caller_session=session, caller_msg=caller, caller_branch=caller.branch, prompt_msg=target,
                        followup_state="delivered", started_at=t0, finished_at=t0))
    Job.objects.bulk_create(jobs)
    for job in jobs:
        Message.objects.filter(pk=job.prompt_msg_id).update(job=job)
    return session


@pytest.mark.parametrize("sizes", [(2 * PAGE_ROWS + 10, 6, 3000, 60)])
def test_a_page_costs_the_same_queries_at_any_session_size(team, sizes):
    """Constant queries per page (newest and older), measured at two sizes."""
    small_n, small_b, big_n, big_b = sizes
    small = _big_session(team, small_n, small_b, title="small")
    big = _big_session(team, big_n, big_b, title="big")
    counts = {}
    for name, session in (("small", small), ("big", big)):
        with CaptureQueriesContext(connection) as newest:
            page = dag_page(session, team.member)
        before = page["older"]
        with CaptureQueriesContext(connection) as older:
            dag_page(session, team.member, before=before)
        counts[name] = (len(newest), len(older))
        assert page["rows"] == PAGE_ROWS and before
    assert counts["small"] == counts["big"], counts
    assert counts["big"][0] <= DAG_QUERIES and counts["big"][1] <= DAG_QUERIES, counts
    # and through the page's own route (authorization, session, template): the same at both sizes
    client = Client()
    client.force_login(team.member)
    routes = {}
    for name, session in (("small", small), ("big", big)):
        client.get(f"/s/{session.pk}/dag")  # the login's first request loads what every later one reuses
        with CaptureQueriesContext(connection) as column:
            assert client.get(f"/s/{session.pk}/dag").status_code == 200
        routes[name] = len(column)
    assert routes["small"] == routes["big"], routes


def test_keyset_pages_walk_the_whole_session_without_gaps_or_overlaps(team):
    session = _big_session(team, 2 * PAGE_ROWS + 17, 9)
    pages, page = [], dag_page(session, team.member)
    pages.append([n["id"] for n in page["graph"].nodes])
    while page["older"]:
        page = dag_page(session, team.member, before=page["older"])
        pages.append([n["id"] for n in page["graph"].nodes])
    assert [len(p) for p in pages] == [PAGE_ROWS, PAGE_ROWS, 17]
    walked = [i for p in reversed(pages) for i in p]
    expected = list(Message.objects.filter(session=session).order_by("created_at", "id").values_list("pk", flat=True))
    assert walked == expected
    # lanes past the cap fold into "+N"
    assert page["graph"].folded == 1 and dag_page(session, team.member)["graph"].folded == 1
    # a bad cursor is a 400, not a 500
    client = Client()
    client.force_login(team.member)
    assert client.get(f"/s/{session.pk}/dag?before=nosuchrow").status_code == 400
    for bad in ("x", "²", "9" * 5000, "-1", "0"):  # a digit int() refuses, one past its length limit
        assert client.get(f"/s/{session.pk}/", {"at": bad}).status_code == 400, bad


def test_a_call_into_a_session_the_viewer_cannot_see_names_nothing(team):
    """Private sessions on the graph: the card of a spawn into a private session shows neither its id nor
    its title to a member who may not see it; a maintainer sees both."""
    from collab.services.sessions import do_create_session
    from collab.services.visibility import do_set_visibility

    mine = _big_session(team, 6, 1, title="mine")
    secret = do_create_session(team.owner, team.alpha, title="Secret plans")
    do_set_visibility(team.owner, secret, "private")
    caller = Message.objects.filter(session=mine).order_by("created_at").first()
    target_branch = secret.branches.get()
    prompt = Message.objects.create(session=secret, branch=target_branch, role="user", text="hush")
    Job.objects.create(project=team.alpha, session=secret, branch=target_branch, kind="spawn", status="queued",
                       caller_session=mine, caller_msg=caller, caller_branch=caller.branch, prompt_msg=prompt)
    client = Client()
    client.force_login(team.member)
    html = client.get(f"/s/{mine.pk}/").content.decode()
    assert 'data-edge="spawn"' in html and "another session" in html
    assert secret.pk not in html and "Secret plans" not in html
    client.force_login(team.maintainer)
    html = client.get(f"/s/{mine.pk}/").content.decode()
    assert "Secret plans" in html and f'data-to="{secret.pk}"' in html


def test_replay_at_event_n_shows_the_graph_as_it_was(story, team):
    from collab.models import Event

    session = Session.objects.get(pk=story.sid)
    created = list(Event.objects.filter(session=session, type="message.created").order_by("seq"))
    for n_rows in (1, 4, len(created)):
        at = created[n_rows - 1].seq
        graph = dag_page(session, team.member, at=at)["graph"]
        assert [n["id"] for n in graph.nodes] == [
            m.pk for m in Message.objects.filter(pk__in=[e.payload["id"] for e in created[:n_rows]])
            .exclude(kind="attach").order_by("created_at", "id")]
    # before the fork was archived its lane is not dimmed; at the end it is
    archived_seq = Event.objects.get(session=session, type="branch.archived").seq
    early = dag_page(session, team.member, at=archived_seq - 1)["graph"]
    late = dag_page(session, team.member, at=archived_seq)["graph"]
    assert not any(n["archived"] for n in early.nodes)
    assert any(n["archived"] for n in late.nodes if n["branch"] == story.fork.pk)
    client = Client()
    client.force_login(team.viewer)
    html = client.get(f"/s/{story.sid}/?at=3").content.decode()
    assert 'data-at="3"' in html and "?at=4" in html and "?at=2" in html and 'id="dag-live"' not in html


def test_text_in_the_graph_is_escaped(team):
    """Model and user text reach the SVG only escaped (threat model: all model output is untrusted)."""
    session = _big_session(team, 3, 1, title="xss")
    Message.objects.filter(session=session).update(text='<script>alert(1)</script>"><img src=x onerror=alert(2)>')
    Branch.objects.filter(session=session).update(name='<b onmouseover="x">main</b>', archived=True,
                                                  archived_at=timezone.now(), archive_reason="<i>why</i>")
    client = Client()
    client.force_login(team.member)
    html = client.get(f"/s/{session.pk}/dag").content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html and "<b onmouseover" not in html
    assert "<i>why" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;i&gt;why&lt;/i&gt;" in html


def test_a_result_from_another_session_is_a_card_on_both_sides(team):
    """A child in another session (an explorer, a spawn into another session): its result arrives in
    the caller's mailbox (an ``agent_message`` row); the caller's graph shows a result card from the
    child's session, the child's graph a result card to the caller's."""
    from collab.services.sessions import do_create_session

    parent = _big_session(team, 4, 1, title="parent")
    child = do_create_session(team.member, team.alpha, title="explorer one")
    child_branch = child.branches.get()
    calling = Message.objects.filter(session=parent).order_by("created_at").last()
    prompt = Message.objects.create(session=child, branch=child_branch, role="user", kind="agent_spawn", text="look")
    debt = Job.objects.create(project=team.alpha, session=child, branch=child_branch, kind="spawn", status="succeeded",
                              caller_session=parent, caller_msg=calling, caller_branch=calling.branch, prompt_msg=prompt,
                              followup_state="delivered", started_at=timezone.now(), finished_at=timezone.now())
    Message.objects.filter(pk=prompt.pk).update(job=debt)
    answer = Message.objects.create(session=child, branch=child_branch, role="assistant", text="found it", job=debt,
                                    predecessor=prompt, depth=1)
    arrival = Message.objects.create(session=parent, branch=calling.branch, role="user", kind="agent_message",
                                     text="<agent_message>…</agent_message>", predecessor=calling, depth=calling.depth + 1,
                                     metadata={"result_of": debt.pk, "status": "succeeded"})
    graph = dag_page(parent, team.member)["graph"]
    cards = {(c["kind"], c["from"], c["to"], c["card_text"]) for n in graph.nodes for c in n["cards"]}
    assert ("spawn", calling.pk, child.pk, "→ spawn 'main' in explorer one") in cards
    assert ("result", child.pk, arrival.pk, "← result from explorer one") in cards
    child_graph = dag_page(child, team.member)["graph"]
    child_cards = {(c["kind"], c["from"], c["to"], c["card_text"]) for n in child_graph.nodes for c in n["cards"]}
    assert ("spawn", parent.pk, prompt.pk, "← spawn from parent") in child_cards
    assert ("result", answer.pk, parent.pk, "→ result to parent") in child_cards


def test_the_live_block_refreshes_from_its_first_row_and_stays_bounded(team, monkeypatch):
    """The live block (the newest page) re-fetches every row from its own first one, so rows never
    move between blocks; past ``SINCE_MAX_ROWS`` it becomes the newest page again, with the link to
    the rows before it (no row lost)."""
    from collab.selectors import dag

    session = _big_session(team, 20, 2, title="live")
    ids = list(Message.objects.filter(session=session).order_by("created_at", "id").values_list("pk", flat=True))
    client = Client()
    client.force_login(team.member)
    html = client.get(f"/s/{session.pk}/dag?since={ids[5]}", HTTP_HX_REQUEST="true").content.decode()
    assert html.count("data-node=") == 15 and "dag-older" not in html and f"since={ids[5]}" in html
    monkeypatch.setattr(dag, "SINCE_MAX_ROWS", 10)
    monkeypatch.setattr(dag, "PAGE_ROWS", 8)
    html = client.get(f"/s/{session.pk}/dag?since={ids[5]}", HTTP_HX_REQUEST="true").content.decode()
    assert html.count("data-node=") == 8 and f"before={ids[12]}" in html and f"since={ids[12]}" in html


def test_the_migration_places_existing_branches_as_if_each_had_opened_then(team):
    """0015_branch_lane gives rows written before lanes existed the lanes ``open_lane`` would have:
    in creation order, nearest the parent's, a lane reused once its branch was archived."""
    import importlib

    from django.apps import apps

    migration = importlib.import_module("collab.migrations.0015_branch_lane")
    session = _big_session(team, 6, 1, title="old")
    main = session.branches.get()
    fork_point = Message.objects.filter(branch=main).order_by("created_at").first()
    t = timezone.now()
    a = Branch.objects.create(session=session, name="a", forked_from=fork_point, created_at=t)
    b = Branch.objects.create(session=session, name="b", forked_from=fork_point, created_at=t + timedelta(seconds=1),
                              archived=True, archived_at=t + timedelta(seconds=2))
    c = Branch.objects.create(session=session, name="c", forked_from=fork_point, created_at=t + timedelta(seconds=3))
    Branch.objects.filter(session=session).update(lane=0)
    migration.assign_lanes(apps, None)
    lanes = dict(Branch.objects.filter(session=session).values_list("name", "lane"))
    assert lanes == {"main": 0, "a": 1, "b": 2, "c": 2}
    assert {a.pk, b.pk, c.pk} <= set(Branch.objects.values_list("pk", flat=True))
