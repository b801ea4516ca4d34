"""The session page's live fragments, through the real URL stack.

The page's script asks for exactly what one event changed — the rows of the shown branch after
the last one it shows, one job row, one branch row, the running indicator — and each answer
costs the same number of queries however long the session is.
"""

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from collab.models import TERMINAL_STATUSES, Branch, Job, NameStage
from tests.conftest import poll

pytestmark = pytest.mark.django_db(transaction=True)


def grow(sid, count: int, branch_name: str = "main") -> list[str]:
    """Append ``count`` messages to a branch of the session, one committed transaction each."""
    from collab.services.messages import append_message

    ids = []
    for i in range(count):
        with transaction.atomic():
            branch = Branch.objects.select_related("tip").get(session_id=sid, name=branch_name)
            ids.append(append_message(branch, role=("user", "assistant")[i % 2], text=f"row {i}").pk)
    return ids


def row_ids(html: str) -> list[str]:
    return re.findall(r'<article [^>]*data-message="([^"]+)"', html)


def main_of(sid) -> Branch:
    return Branch.objects.get(session_id=sid, name="main")


def test_rows_after_a_message_are_exactly_the_new_rows_with_the_running_indicator(
        team, scripted_session, browser_of):
    """``GET /s/{sid}/rows?branch=B&after=M``: the rows of B's lineage after M, oldest first, and the
    running indicator out of band; nothing after the tip is nothing."""
    _, sid = scripted_session(team.member, [{"text": "x"}])
    ids = grow(sid, 6)
    page = browser_of(team.member)
    main = main_of(sid)

    r = page.get(f"/s/{sid}/rows", {"branch": main.pk, "after": ids[3]})
    assert r.status_code == 200
    html = r.content.decode()
    assert row_ids(html) == ids[4:]
    assert 'id="running"' in html and 'hx-swap-oob="true"' in html
    assert '<details class="fork">' in html  # the same row as the page renders, for someone who may fork

    assert row_ids(page.get(f"/s/{sid}/rows", {"branch": main.pk, "after": ids[-1]}).content.decode()) == []
    assert row_ids(page.get(f"/s/{sid}/rows", {"branch": main.pk}).content.decode()) == ids  # from the start
    viewer = browser_of(team.viewer).get(f"/s/{sid}/rows", {"branch": main.pk, "after": ids[3]}).content.decode()
    assert row_ids(viewer) == ids[4:] and '<details class="fork">' not in viewer


def test_rows_cost_the_same_queries_on_a_short_and_a_long_session(team, scripted_session, browser_of):
    """Bounded work per event: two new rows cost the same queries after 5 messages as after 60."""
    page = browser_of(team.member)
    counts = []
    for agent_id, size in (("short", 5), ("long", 60)):
        _, sid = scripted_session(team.member, [{"text": "x"}], agent_id=agent_id)
        ids = grow(sid, size)
        main = main_of(sid)
        with CaptureQueriesContext(connection) as queries:
            r = page.get(f"/s/{sid}/rows", {"branch": main.pk, "after": ids[-3]})
        assert row_ids(r.content.decode()) == ids[-2:]
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_a_page_too_far_behind_or_off_the_lineage_is_told_to_reload(team, scripted_session, browser_of):
    """More rows than one live fetch carries, or an ``after`` that is not on the branch's lineage
    (409: the page reloads its transcript); a branch or message not in the session is a 404, a
    missing ``branch`` means the branch this viewer reads, an outsider a 404."""
    from collab.selectors.pages import LIVE_ROWS
    from collab.services.branches import create_branch

    _, sid = scripted_session(team.member, [{"text": "x"}])
    ids = grow(sid, LIVE_ROWS + 3)
    main = main_of(sid)
    page = browser_of(team.member)
    assert page.get(f"/s/{sid}/rows", {"branch": main.pk, "after": ids[0]}).status_code == 409
    assert page.get(f"/s/{sid}/rows", {"branch": main.pk}).status_code == 409
    assert row_ids(page.get(f"/s/{sid}/rows", {"branch": main.pk, "after": ids[2]}).content.decode()) == ids[3:]

    with transaction.atomic():
        from collab.models import Message, Session

        fork = create_branch(Session.objects.get(pk=sid), name="side", name_stage=NameStage.MANUAL,
                             forked_from=Message.objects.get(pk=ids[1]))
    side = grow(sid, 2, "side")
    assert row_ids(page.get(f"/s/{sid}/rows", {"branch": fork.pk, "after": ids[1]}).content.decode()) == side
    assert page.get(f"/s/{sid}/rows", {"branch": fork.pk, "after": ids[-1]}).status_code == 409  # main's, not side's

    _, other = scripted_session(team.member, [{"text": "x"}], agent_id="other")
    assert page.get(f"/s/{sid}/rows", {"branch": main_of(other).pk}).status_code == 404
    assert page.get(f"/s/{sid}/rows", {"branch": main.pk, "after": "nope"}).status_code == 404
    main.refresh_from_db()
    assert page.get(f"/s/{sid}/rows", {"after": main.tip_id}).status_code == 200  # the shown branch, nothing new
    assert browser_of(team.outsider).get(f"/s/{sid}/rows", {"branch": main.pk}).status_code == 404


def test_a_job_row_carries_usage_its_branch_row_and_the_running_indicator(team, scripted_session, browser_of):
    """``GET /s/{sid}/jobs/{job}``: that job's row; out of band the usage line and its branch's row,
    and — for a page showing the job's branch — the running indicator."""
    from collab.services.execution import claim_job

    api, sid = scripted_session(team.member, [{"sleep_ms": 30000}, {"text": "x"}])
    job = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"]
    claim_job(job)  # here, or by a worker this test session started (it then sleeps in the turn)
    poll(lambda: Job.objects.get(pk=job).status == "running", what="the job to run")
    main = main_of(sid)
    page = browser_of(team.member)

    html = page.get(f"/s/{sid}/jobs/{job}", {"branch": main.pk}).content.decode()
    assert re.search(rf'<li class="job status-running" id="job-{job}"', html)
    assert f"/s/{sid}/jobs/{job}/cancel" in html
    assert 'id="usage"' not in html  # its tokens are not final yet
    assert re.search(rf'id="branch-{main.pk}" data-branch="{main.pk}" hx-swap-oob="true"', html)
    assert "the agent is working" in html and 'id="running" class="running" hx-swap-oob="true"' in html

    other_branch = page.get(f"/s/{sid}/jobs/{job}", {"branch": "elsewhere"}).content.decode()
    assert 'id="running"' not in other_branch
    branch = page.get(f"/s/{sid}/branches/{main.pk}").content.decode()
    assert "running" in branch and f'id="branch-{main.pk}"' in branch and "hx-swap-oob" not in branch
    running = page.get(f"/s/{sid}/running", {"branch": main.pk}).content.decode()
    assert "the agent is working" in running and "hx-swap-oob" not in running

    assert page.get(f"/s/{sid}/jobs/nope").status_code == 404
    assert page.get(f"/s/{sid}/branches/nope").status_code == 404
    assert page.get(f"/s/{sid}/agents/nope").status_code == 404
    assert browser_of(team.outsider).get(f"/s/{sid}/jobs/{job}").status_code == 404

    # once a job has ended its row carries the session's usage line too
    api2, sid = scripted_session(team.member, [{"text": "x"}], agent_id="second")
    ended = api2.post(f"/api/sessions/{sid}/turns", {"prompt": "later"}).json()["execution_id"]
    # cancelled here, or already run by a worker this test session started: either way it ends
    page.post(f"/s/{sid}/jobs/{ended}/cancel", {}, HTTP_HX_REQUEST="true")
    poll(lambda: Job.objects.get(pk=ended).status in TERMINAL_STATUSES, what="the job to end")
    finished = page.get(f"/s/{sid}/jobs/{ended}").content.decode()
    assert re.search(r'id="usage" hx-swap-oob="true">tokens \d+ in / \d+ out', finished), finished
    assert Job.objects.get(pk=job).status == "running"


def test_one_row_is_re_rendered_with_the_attach_pointer_hung_off_it(team, scripted_session, browser_of):
    """``GET /s/{sid}/m/{mid}/row``: the row of one message, now with the attach card of an agent
    spawned from it (the page patches that row alone); an attach pointer is no row of its own."""
    from collab.models import MessageKind
    from collab.services.messages import append_message

    _, sid = scripted_session(team.member, [{"text": "x"}])
    ids = grow(sid, 2)
    page = browser_of(team.member)
    before = page.get(f"/s/{sid}/m/{ids[1]}/row").content.decode()
    assert row_ids(before) == [ids[1]] and "data-attach" not in before
    with transaction.atomic():
        main = Branch.objects.select_related("tip").get(pk=main_of(sid).pk)
        pointer = append_message(main, role="system", kind=MessageKind.ATTACH, predecessor=main.tip, move_tip=False,
                                 text="spawned 'helper'",
                                 metadata={"attach": {"session_id": sid, "head_id": ids[1], "branch": main.pk,
                                                      "execution_id": "e1"}})
    after = page.get(f"/s/{sid}/m/{ids[1]}/row", {"branch": main.pk}).content.decode()
    assert row_ids(after) == [ids[1]] and f'data-attach="{pointer.pk}"' in after
    assert page.get(f"/s/{sid}/m/{pointer.pk}/row").status_code == 404
    assert browser_of(team.outsider).get(f"/s/{sid}/m/{ids[1]}/row").status_code == 404
