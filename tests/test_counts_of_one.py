"""A count of one reads in the singular — "1 turn", "1 message", "1 branch" — wherever Trellis
writes a number before a noun: pages, the admin's messages, agents' tool results, refusals."""

import re

import pytest
from django.template.loader import render_to_string
from django.test import Client

from collab.models import Branch


def _one_turn(api, sid):
    from collab.runtime.loop import run_job

    run_job(api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"])


def test_a_branch_of_one_turn_reads_1_turn_in_its_transcript(team, scripted_session):
    from collab.selectors.transcript import render_transcript

    api, sid = scripted_session(team.member, [{"text": "answer"}])
    _one_turn(api, sid)
    branch = Branch.objects.get(session_id=sid, name="main")
    text = render_transcript(branch, viewer=team.member, start_turn=5)["text"]
    assert "the branch has 1 turn)" in text
    assert "1 turns" not in text


def test_a_transcript_cut_after_one_turn_says_1_later_turn_omitted(team, scripted_session):
    from collab.selectors.transcript import render_transcript

    api, sid = scripted_session(team.member, [{"text": "a long answer " * 20}])
    _one_turn(api, sid)
    _one_turn(api, sid)
    branch = Branch.objects.get(session_id=sid, name="main")
    text = render_transcript(branch, viewer=team.member, max_chars=300)["text"]
    assert "[1 later turn omitted" in text
    assert "1 later turns" not in text


def _dag(rows, folded):
    graph = {"folded": folded, "width": 40, "height": 40, "fold_x": 30, "segments": [], "edges": [], "nodes_svg": ""}
    return render_to_string("collab/_dag_page.html",
                            {"dag": {"rows": rows, "graph": graph, "at": None}, "live": False, "session": {"pk": "s"}})


def test_the_graph_of_one_message_is_labelled_1_message_and_one_folded_branch_in_the_singular():
    html = _dag(rows=1, folded=1)
    assert 'aria-label="1 message"' in html
    assert "1 more branch shares the last column" in html
    assert "1 messages" not in html and "1 more branches" not in html


def test_the_graph_of_many_messages_and_folded_branches_keeps_the_plural():
    html = _dag(rows=3, folded=2)
    assert 'aria-label="3 messages"' in html
    assert "2 more branches share the last column" in html


def _message(**m):
    base = {"pk": "m1", "role": "assistant", "kind": "normal", "text": "", "card": None, "attaches": [], "stops": []}
    return render_to_string("collab/_message.html", {"m": {**base, **m}, "t": {}, "session": {"pk": "s"}})


def test_a_one_character_tool_result_reads_1_character():
    html = _message(role="tool", tool="grep", text="x")
    assert "1 character<" in html and "1 characters" not in html


def test_a_card_of_one_token_reads_1_token():
    html = _message(card={"kind": "result", "label": "result of", "agent": "bot", "tokens": 1, "duration": None})
    assert re.search(r"\b1 token\b", html) and "1 tokens" not in html
    html = _message(card={"kind": "result", "label": "result of", "agent": "bot", "tokens": 2, "duration": None})
    assert "2 tokens" in html


def test_archiving_one_branch_in_the_admin_says_1_branch(team, scripted_session, django_user_model):
    api, sid = scripted_session(team.member, [{"text": "x"}])
    branch = Branch.objects.get(session_id=sid, name="main")
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("operator", "op@example.com", "pw-secret-123"))
    page = client.post("/admin/collab/branch/", {"action": "archive_branches", "_selected_action": [branch.pk],
                                                 "index": 0, "reason": "done"}, follow=True).content.decode()
    assert "archived 1 branch<" in page.lower() and "1 branches" not in page


def test_a_project_limit_of_one_reads_1_project():
    from accounts.services import ProjectLimitReached

    assert "you already own 1 project," in str(ProjectLimitReached(1))
    assert "you already own 3 projects," in str(ProjectLimitReached(3))


@pytest.mark.parametrize("limit,expected", [(1, "1 job is already waiting"), (2, "2 jobs are already waiting")])
def test_a_full_queue_of_one_reads_1_job_is_waiting(team, scripted_session, limit, expected):
    api, sid = scripted_session(team.member, [{"text": "x"}])
    team.alpha.max_queued_per_session = limit
    team.alpha.save()
    for _ in range(limit):
        api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"})
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "one too many"})
    assert r.status_code >= 400, r.content
    assert expected in r.content.decode(), r.content
