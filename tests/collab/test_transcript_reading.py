"""Reading a branch: the session page's transcript as people read it.

Selection is per viewer (URL + their own web session), a node link positions the page at the
node, inherited history is set apart with a way back, what was written for a model is shown as
cards, tool calls as JSON, a stopped turn leaves a marker, nothing names a session the viewer may
not see, and the page costs the same number of queries however long the branch.

Rows are built through the API and the tool gateway; turns run in this process exactly as a
worker runs them (``run_job``), so no worker is needed.
"""

import html as html_lib
import json
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership
from collab.models import Branch, Job, Message, Session
from collab.runtime.loop import run_job
from collab.services.followup import deliver_owed

SCRIPT = {
    "user": [{"tool_calls": [{"name": "todo_create", "arguments": {"subject": "plan <b>it</b>", "description": "step one"}}]},
             {"text": "answer: {{prompt}}"}],
    "spawn": [{"text": "child says <b>42</b>"}],
    "task": [{"text": "task done"}],
    "message": [{"text": "noted"}],
    "followup": [{"text": "thanks for the result"}],
}


def page_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(client, sid, **params) -> str:
    r = client.get(f"/s/{sid}/", params)
    assert r.status_code == 200, r.status_code
    return r.content.decode()


def shown(body: str) -> str:
    """The id of the branch a rendered page shows."""
    return re.search(r'id="transcript" class="transcript" data-branch="([^"]*)"', body).group(1)


def transcript_part(body: str) -> str:
    """The transcript column of a page (the DAG and the activity feed may quote the same text)."""
    start = body.index('id="transcript"')
    return body[start:body.index("</section>", start)]


def marked(body: str) -> list[str]:
    """The branch ids the branch list marks as the one shown."""
    return re.findall(r'<li class="branch[^"]* current"[^>]* data-branch="([^"]+)"[^>]*><a [^>]*aria-current="page"', body)


def turn(api, sid, prompt, branch=None, run=True) -> str:
    body = {"prompt": prompt, **({"branch": branch} if branch else {})}
    r = api.post(f"/api/sessions/{sid}/turns", body)
    assert r.status_code == 202, r.content
    job = r.json()["execution_id"]
    if run:
        assert run_job(job) == "succeeded"
    return job


def tool(api, address, name, **arguments) -> dict:
    r = api.post(f"/api/branches/{address}/tools/{name}", {"arguments": arguments})
    assert r.status_code == 200 and not r.json()["is_error"], r.content
    return r.json()


def main_of(sid) -> Branch:
    return Branch.objects.select_related("tip").get(session_id=sid, name="main")


def run_result_home(branch: Branch) -> None:
    """Settle what is owed to ``branch`` (the after-commit hook a test transaction never fires)
    and run the follow-up turns that admits."""
    for job in deliver_owed(branch.pk):
        assert run_job(job.pk) == "succeeded"


def spawn_and_return(api, sid, prompt="compute", description="helper") -> Branch:
    """A background agent of main, run to its end, its result brought home as a follow-up turn."""
    main = main_of(sid)
    job_id = tool(api, main.address, "agent", prompt=prompt, description=description,
                  run_in_background=True)["details"]["execution_id"]
    assert run_job(job_id) == "succeeded"
    run_result_home(main)
    return Branch.objects.select_related("tip").get(pk=Job.objects.get(pk=job_id).branch_id)


# --- selection per viewer -----------------------------------------------------------------------------


def test_a_fork_made_by_one_person_never_moves_what_others_land_on(team, scripted_session):
    """A forks from the page; B (who had the session open) and a maintainer who
    never opened it still land on main, the session's selected HEAD did not move, A lands on the
    fork (their own memory), and an agent's new branch moves nobody. Each viewer's list marks the
    branch that viewer reads."""
    api, sid = scripted_session(team.member, SCRIPT)
    turn(api, sid, "first question")
    main = main_of(sid)
    head_before = Session.objects.get(pk=sid).head_id
    a, b, c = page_of(team.member), page_of(team.viewer), page_of(team.maintainer)
    assert shown(page(b, sid)) == main.pk

    first = Message.objects.get(branch=main, text="first question")
    r = a.post(f"/s/{sid}/m/{first.pk}/fork", {"prompt": "try another way"})
    assert r.status_code == 302
    fork = Branch.objects.exclude(pk=main.pk).get(session_id=sid)
    assert r["Location"].endswith(f"?branch={fork.pk}")
    assert run_job(Job.objects.get(branch=fork).pk) == "succeeded"
    spawn_and_return(api, sid)  # an agent opens a branch too

    assert Session.objects.get(pk=sid).head_id == head_before
    for other in (b, c):
        body = page(other, sid)
        assert shown(body) == main.pk and marked(body) == [main.pk]
    mine = page(a, sid)
    assert shown(mine) == fork.pk and marked(mine) == [fork.pk]
    # the branches partial refreshed on its own still marks the viewer's branch
    assert marked(a.get(f"/s/{sid}/branches", {"branch": fork.pk}).content.decode()) == [fork.pk]

    # each viewer's choice is theirs: B reads the fork, A goes back to main; neither moves the other
    assert shown(page(b, sid, branch=fork.pk)) == fork.pk
    assert shown(page(a, sid, branch=main.pk)) == main.pk
    assert shown(page(b, sid)) == fork.pk and shown(page(a, sid)) == main.pk
    assert shown(page(c, sid)) == main.pk


def test_the_composer_answer_shows_the_branch_the_turn_went_to(team, scripted_session):
    """A person posting on a fork gets that fork's transcript back (htmx), not the
    session's selected branch."""
    api, sid = scripted_session(team.member, SCRIPT)
    turn(api, sid, "first question")
    main = main_of(sid)
    a = page_of(team.member)
    a.post(f"/s/{sid}/m/{main.tip_id}/fork", {"prompt": "fork line"})
    fork = Branch.objects.exclude(pk=main.pk).get(session_id=sid)
    assert run_job(Job.objects.get(branch=fork).pk) == "succeeded"
    fork.refresh_from_db()
    r = a.post(f"/s/{sid}/turns", {"prompt": "more on the fork", "branch": fork.address}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert shown(r.content.decode()) == fork.pk and "more on the fork" in r.content.decode()
    assert Session.objects.get(pk=sid).head.branch_id == main.pk


# --- positioned at the node ---------------------------------------------------------------------------


def test_a_node_link_opens_its_branch_at_that_message(team, scripted_session, monkeypatch):
    """``?head=`` (alone or with ``?branch=``) shows the branch holding the node
    with that row marked (``aria-current``); a node older than the page's window still shows, with
    the newer rows counted and a link to the latest; ids that name nothing here are a 404."""
    from collab.selectors import transcript

    api, sid = scripted_session(team.member, SCRIPT)
    for n in range(4):
        turn(api, sid, f"question {n}")
    main = main_of(sid)
    q1 = Message.objects.get(branch=main, text="question 1")
    viewer = page_of(team.viewer)

    for params in ({"head": q1.pk}, {"branch": main.pk, "head": q1.pk}):
        body = page(viewer, sid, **params)
        assert shown(body) == main.pk
        assert re.search(rf'id="m-{q1.pk}" aria-current="location"', body)
        assert body.count('aria-current="location"') == 1
        assert "answer: question 3" in body  # the window still reaches the tip

    monkeypatch.setattr(transcript, "PAGE_WINDOW", 3)
    body = page(viewer, sid, head=q1.pk)
    assert re.search(rf'id="m-{q1.pk}" aria-current="location"', body)
    assert "answer: question 3" not in transcript_part(body) and "newer messages on this branch" in body
    assert f'href="/s/{sid}/?branch={main.pk}">show the latest' in body
    assert "answer: question 3" in page(viewer, sid)

    other_api, other_sid = scripted_session(team.member, SCRIPT, agent_id="bot2")
    turn(other_api, other_sid, "elsewhere")
    elsewhere = main_of(other_sid).tip_id
    for params in ({"head": elsewhere}, {"branch": main_of(other_sid).pk}, {"head": "nope"}, {"branch": "nope"}):
        assert viewer.get(f"/s/{sid}/", params).status_code == 404
        assert viewer.get(f"/s/{sid}/transcript", params).status_code == 404


def test_inherited_history_is_set_apart_with_a_link_back_to_the_fork_point(team, scripted_session):
    """A fork's page folds the history it inherited into a collapsed section,
    then a divider "branched from main at …" linking to main at that node; its own rows follow.
    Opened at an inherited node, the section is open. main itself has no divider."""
    api, sid = scripted_session(team.member, SCRIPT)
    turn(api, sid, "first question")
    turn(api, sid, "second question")
    main = main_of(sid)
    first = Message.objects.get(branch=main, text="first question")
    a = page_of(team.member)
    a.post(f"/s/{sid}/m/{first.pk}/fork", {"prompt": "the other way"})
    fork = Branch.objects.exclude(pk=main.pk).get(session_id=sid)
    assert run_job(Job.objects.get(branch=fork).pk) == "succeeded"

    body = page(a, sid, branch=fork.pk)
    inherited = re.search(r'<details class="inherited">(.*?)</details>\s*<div class="fork-divider"', body, re.DOTALL)
    assert inherited and f'id="m-{first.pk}"' in inherited.group(1) and "msg role-user kind-normal inherited" in inherited.group(1)
    assert "second question" not in transcript_part(body)  # main's later history is not the fork's
    divider = re.search(r'<div class="fork-divider".*?</div>', body, re.DOTALL).group(0)
    assert f'href="/s/{sid}/?branch={main.pk}&amp;head={first.pk}">main</a>' in divider
    assert "branched from" in divider and "first question" in divider and "<time" in divider
    own = body[body.index('class="fork-divider"'):]
    assert "the other way" in own and "answer: the other way" in own

    opened = page(a, sid, branch=fork.pk, head=first.pk)
    assert '<details class="inherited" open>' in opened
    assert "fork-divider" not in page(a, sid, branch=main.pk)


# --- cards, JSON, markers ------------------------------------------------------------------------------


def test_results_tasks_and_messages_are_cards_not_the_text_the_model_read(team, scripted_session):
    """A background agent's result (a follow-up turn), its task prompt, a
    send_message and a delegation render as cards (who, status, duration, tokens, a link to the
    other side at the node, the body) without the headers written for the model; tool calls are
    indented JSON and tool results collapsible; every piece of text is escaped."""
    api, sid = scripted_session(team.member, SCRIPT)
    turn(api, sid, "first question")
    child = spawn_and_return(api, sid)
    main = main_of(sid)
    tool(api, main.address, "send_message", to=child.address, message="ping <i>you</i>")
    assert run_job(Job.objects.get(branch=child, kind="message").pk) == "succeeded"
    tool(api, main.address, "agent", to=child.address, prompt="do the task")
    assert run_job(Job.objects.get(branch=child, kind="task").pk) == "succeeded"

    viewer = page_of(team.viewer)
    body = page(viewer, sid)
    assert "[result from" not in transcript_part(body) and "finished execution" not in transcript_part(body)
    card = re.search(r'<article class="msg msg-card card-result role-user kind-followup.*?</article>', body, re.DOTALL).group(0)
    assert re.search(rf'result from\s*<a class="agent" href="/s/{sid}/\?branch={child.pk}&amp;head=\w+">helper</a>', card)
    assert "status-succeeded" in card and " s" in card
    assert "child says &lt;b&gt;42&lt;/b&gt;" in card and "<b>42" not in body
    assert "delivered as a follow-up turn" in card

    # tool calls as indented JSON (escaped), results folded
    args = json.dumps({"subject": "plan <b>it</b>", "description": "step one"}, indent=2)
    assert f'<span class="tool-name">todo_create</span><pre><code>{html_lib.escape(args)}</code></pre>' in body
    assert re.search(r'<details class="tool-result"><summary><code>todo_create</code>', body)
    assert "{'subject'" not in body  # no Python reprs

    child_page = page(viewer, sid, branch=child.pk)
    column = transcript_part(child_page)
    assert "[task from" not in column and "[message from" not in column and "A reply is optional" not in column
    for kind, label, text in (("spawn", "started by", "compute"), ("message", "message from", "ping &lt;i&gt;you&lt;/i&gt;"),
                              ("task", "task from", "do the task")):
        card = re.search(rf'<article class="msg msg-card card-{kind} .*?</article>', child_page, re.DOTALL).group(0)
        assert re.search(rf'{label}\s*<a class="agent" href="/s/{sid}/\?branch={main.pk}&amp;head=\w+">main</a>', card), card
        assert f'<div class="text">{text}</div>' in card and "status-succeeded" in card


def test_openwork_deliveries_are_cards_and_record_where_their_body_is(team, scripted_session):
    """An explorer's ``<agent_message>`` drained into its parent renders
    as a "result from <task name>" card with the body only; the message records the body's span
    and its source in its metadata (written for people, beside the text the model reads)."""
    script = {"user": [{"text": "summary ready"}], "spawn": [{"text": "found it in auth.py"}]}
    api, sid = scripted_session(team.member, script, agent_id="ow", toolset="openwork")
    turn(api, sid, "go")
    main = Branch.objects.select_related("tip").get(session_id=sid, task_name__isnull=True)
    tool(api, main.address, "spawn_agent", task_name="scout", message="look around")
    child = Branch.objects.get(task_name="scout")
    assert run_job(Job.objects.get(branch=child).pk) == "succeeded"
    turn(api, sid, "and now?")

    delivered = Message.objects.get(branch=main, kind="agent_message")
    start, end = delivered.metadata["body"]
    assert delivered.text.startswith("<agent_message>") and delivered.text[start:end] == "found it in auth.py"
    assert delivered.metadata["from"].startswith(f"{child.session_id}:")

    body = page(page_of(team.member), sid)
    assert "&lt;agent_message&gt;" not in transcript_part(body) and "&lt;task&gt;" not in transcript_part(body)
    card = re.search(r'<article class="msg msg-card card-result role-mailbox kind-agent_message.*?</article>', body, re.DOTALL).group(0)
    assert re.search(rf'result from\s*<a class="agent" href="/s/{child.session_id}/\?branch={child.pk}&amp;head=\w+">scout</a>', card)
    assert '<div class="text">found it in auth.py</div>' in card and "status-succeeded" in card


def test_old_rows_without_a_body_span_still_render_as_cards(team, scripted_session):
    """Results delivered before the ``body`` span was recorded are read with the
    format both the writer and the reader take from collab/deliveries.py (``split_delivery``)."""
    from collab.deliveries import split_delivery

    assert split_delivery("[result from s1:m1]\nAgent 'x' finished execution j1:\n\nthe answer\nline 2") == (
        "s1:m1", "the answer\nline 2")
    assert split_delivery("[result from s1:m1]\nAgent 'x' did not finish execution j1: failed (is_error=true): boom") == (
        "s1:m1", "boom")
    assert split_delivery("<agent_message>\n<task>scout</task>\n<kind>final_answer</kind>\n<body>\nhi\n</body>\n</agent_message>") == ("", "hi")
    assert split_delivery("[result from nowhere") is None

    api, sid = scripted_session(team.member, SCRIPT)
    turn(api, sid, "first question")
    main = main_of(sid)
    job_id = tool(api, main.address, "agent", prompt="compute", description="helper", run_in_background=True)["details"]["execution_id"]
    run_job(job_id)
    turn(api, sid, "drain it")  # the result is drained into this user turn's mailbox
    delivered = Message.objects.get(branch=main, kind="agent_message")
    Message.objects.filter(pk=delivered.pk).update(metadata={"result_of": job_id, "status": "succeeded", "is_error": False})
    card = re.search(r'<article class="msg msg-card card-result role-mailbox.*?</article>', page(page_of(team.member), sid), re.DOTALL).group(0)
    assert "[result from" not in card and '<div class="text">child says &lt;b&gt;42&lt;/b&gt;</div>' in card
    assert ">helper</a>" in card


def test_a_cancelled_or_a_failed_turn_leaves_a_marker_where_it_stopped(team, scripted_session):
    """No message is written when a turn is cancelled or fails, yet the transcript
    shows where it stopped, with the status and the error code and reason of its job row."""
    api, sid = scripted_session(team.member, SCRIPT)
    turn(api, sid, "first question")
    cancelled = turn(api, sid, "never mind", run=False)
    r = api.post(f"/api/executions/{cancelled}/commands",
                 {"command_id": "c1", "action": "execution.cancel", "expected_version": 1, "payload": {}})
    assert r.json()["status"] == "cancelled"
    failed = turn(api, sid, "one more", run=False)
    main = main_of(sid)
    assert api.post(f"/api/branches/{main.address}/archive", {"reason": "done here"}).status_code == 200
    run_job(failed)  # refused at the claim: its branch was archived while it waited
    assert Job.objects.get(pk=failed).status == "failed"

    body = page(page_of(team.viewer), sid)
    for job_id, prompt, words in ((cancelled, "never mind", "Turn stopped: cancelled"),
                                  (failed, "one more", "Turn failed — <code>archived</code>")):
        job = Job.objects.get(pk=job_id)
        row = re.search(rf'<article [^>]*id="m-{job.prompt_msg_id}".*?</article>', body, re.DOTALL).group(0)
        assert prompt in row
        marker = re.search(rf'<p class="stopped status-{job.status}" role="note" data-stopped-job="{job_id}">(.*?)</p>', row, re.DOTALL)
        assert marker and words in marker.group(1), row
    assert "was archived before this delivery started" in body


# --- visibility ----------------------------------------------------------------------------------------


def test_a_card_from_a_session_the_viewer_cannot_see_names_nothing_of_it(team, api_as, make_user, scripted_session):
    """An agent of a project-wide session forks into its creator's
    private session; the result comes home as a card. The creator sees who and where; a member
    who may not see the private session sees the card with neither its id, its name nor a link."""
    colleague = make_user("colleague")
    Membership.objects.create(user=colleague, project=team.alpha, role="member")
    creator, open_sid = scripted_session(team.member, SCRIPT)
    private_sid = creator.post("/api/projects/alpha/sessions", {"title": "mine", "agent_id": "bot"}).json()["id"]
    for sid in (open_sid, private_sid):
        turn(creator, sid, "p")
    assert creator.patch(f"/api/sessions/{private_sid}", {"visibility": "private"}).status_code == 200
    main = main_of(open_sid)
    job_id = tool(creator, main.address, "agent", prompt="continue there", description="secret-fork",
                  start_from=f"{private_sid}:{main_of(private_sid).tip_id}", run_in_background=True)["details"]["execution_id"]
    assert run_job(job_id) == "succeeded"
    run_result_home(main)

    mine = page(page_of(team.member), open_sid)
    card = re.search(r'<article class="msg msg-card card-result.*?</article>', mine, re.DOTALL).group(0)
    assert ">secret-fork</a>" in card and f"/s/{private_sid}/" in card
    theirs = page(page_of(colleague), open_sid)
    card = re.search(r'<article class="msg msg-card card-result.*?</article>', theirs, re.DOTALL).group(0)
    assert "an agent you cannot see" in card and "child says" in card
    assert private_sid not in theirs and "secret-fork" not in theirs and "data-attach" not in theirs


# --- cost ----------------------------------------------------------------------------------------------


def _grow(api, sid, turns: int, spawns: int) -> None:
    for n in range(turns):
        turn(api, sid, f"q{n}")
    for n in range(spawns):
        spawn_and_return(api, sid, description=f"helper{n}")
    cancelled = turn(api, sid, "stop me", run=False)
    api.post(f"/api/executions/{cancelled}/commands",
             {"command_id": f"c-{sid}-{turns}", "action": "execution.cancel", "expected_version": 1, "payload": {}})


@pytest.mark.parametrize("path", ["/s/{sid}/transcript", "/s/{sid}/"])
def test_the_transcript_costs_the_same_queries_at_any_length(team, scripted_session, django_assert_num_queries, path):
    """Constant queries per page, as for the graph: the page with a fork, cards,
    attach pointers and a stopped turn costs the same number of queries with 1 turn and 1 result
    as with 8 turns and 4 results."""
    viewer = page_of(team.viewer)
    counts = []
    for turns, spawns in ((1, 1), (8, 4)):
        api, sid = scripted_session(team.member, SCRIPT, agent_id=f"bot{turns}")
        _grow(api, sid, turns, spawns)
        url = path.format(sid=sid)
        viewer.get(url)  # the viewer's web session remembers the branch: the same writes each time after
        if counts:
            with django_assert_num_queries(counts[0]):
                assert viewer.get(url).status_code == 200
        else:
            with CaptureQueriesContext(connection) as queries:
                assert viewer.get(url).status_code == 200
            counts.append(len(queries))
        assert Message.objects.filter(session_id=sid, kind="followup").count() == spawns
