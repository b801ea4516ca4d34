"""The session page at event N (docs/web-app.md#replay): the transcript, the branch list, the jobs
and the cards as they were then, read from the log — a branch archived later is not archived, a
job that ended later is still running, a message written later is not there — and the page read-only."""

from django.test import Client

from collab.models import Branch, Event, Job, Message, Session
from collab.runtime.loop import run_job
from collab.selectors import pages
from collab.selectors.replay import replay_state
from collab.selectors.transcript import page_transcript

SCRIPT = {"user": [{"text": "answer: {{prompt}}"}], "spawn": [{"text": "scout report"}],
          "followup": [{"text": "thanks"}]}


def _seq(sid, type_, **payload) -> int:
    events = Event.objects.filter(session_id=sid, type=type_).order_by("seq")
    return next(e.seq for e in events if all(e.payload.get(k) == v for k, v in payload.items()))


def test_at_event_n_the_transcript_branches_and_jobs_are_those_of_then(team, scripted_session):
    from collab.gateway import run_as_branch
    from collab.services.archive import do_archive_branch
    from collab.services.followup import deliver_owed
    from collab.services.turns import do_fork_and_start

    api, sid = scripted_session(team.member, SCRIPT)
    first = api.post(f"/api/sessions/{sid}/turns", {"prompt": "first question"}).json()["execution_id"]
    run_job(first)
    main = Branch.objects.get(session_id=sid, name="main")
    run_as_branch(team.member, main.address, "agent", {"prompt": "scout", "description": "scout", "run_in_background": True})
    spawn = Job.objects.get(session_id=sid, kind="spawn")
    run_job(spawn.pk)
    (followup,) = deliver_owed(main.pk)
    run_job(followup.pk)
    main.refresh_from_db()
    fork = do_fork_and_start(team.member, Session.objects.get(pk=sid), main.tip, "another way", name="alt")
    run_job(fork.pk)
    alt = Branch.objects.get(pk=fork.branch_id)
    do_archive_branch(alt, user=team.member, reason="dead end")
    second = api.post(f"/api/sessions/{sid}/turns", {"prompt": "second question", "branch": "main"}).json()["execution_id"]
    run_job(second)
    session = Session.objects.get(pk=sid)

    def then(at, **params):
        replay = replay_state(session, at)
        t = page_transcript(session, team.member, replay=replay, **params)
        jobs = {j.pk: j for j in pages.recent_jobs(session, team.member, replay=replay)}
        branches = {b.pk: b for b in pages.branches(session, replay=replay)}
        return t, jobs, branches

    # the first turn running: its prompt only, the job running (no tokens yet), one branch
    running = _seq(sid, "job.running", job=first)
    t, jobs, branches = then(running, branch_id=main.pk)
    assert [m.text for m in t["messages"]] == ["first question"] and t["running"] == "running"
    assert {pk: j.status for pk, j in jobs.items()} == {first: "running"} and jobs[first].tokens_in == 0
    assert list(branches) == [main.pk] and not branches[main.pk].archived
    t, _, _ = then(running, branch_id=alt.pk)  # a branch asked for that did not exist yet: shown empty
    assert t["not_yet"] and t["messages"] == []

    # the scout admitted, not yet run: its card on main says queued (it says succeeded now)
    queued = _seq(sid, "message.created", id=Message.objects.get(session_id=sid, kind="attach").pk)
    t, jobs, _ = then(queued, branch_id=main.pk)
    (pointer,) = [a for m in t["messages"] for a in m.attaches]
    assert pointer.card.status == "queued" and not pointer.card.tokens
    assert jobs[spawn.pk].status == "queued" and jobs[first].status == "succeeded"

    # just before the fork was archived: listed, not archived; the later turn not there yet
    archived = _seq(sid, "branch.archived", branch=alt.pk)
    second_prompt = main.messages.get(text="second question")
    t, jobs, branches = then(archived - 1, branch_id=main.pk, head_id=second_prompt.pk)
    assert branches[alt.pk].archived is False and branches[alt.pk].archive_reason == ""
    assert second not in jobs and jobs[fork.pk].status == "succeeded"
    assert t["selected"] is None and "second question" not in [m.text for m in t["messages"]]
    assert t["messages"][-1].text == "thanks"
    # at the archive: archived, with its reason; now the present
    _, _, branches = then(archived)
    assert branches[alt.pk].archived and branches[alt.pk].archive_reason == "dead end"
    assert [b.pk for b in pages.branches(session)][-1] == alt.pk  # archived last, as the live list

    # the page: a replay banner, nothing that writes, the fork listed as it was
    client = Client()
    client.force_login(team.member)
    html = client.get(f"/s/{sid}/", {"at": archived - 1, "branch": alt.pk}).content.decode()
    assert f"Replay at event {archived - 1} of {session.last_event_seq}" in html and "back to live" in html
    assert 'id="composer"' not in html and 'class="fork"' not in html and "data-live=" not in html
    assert 'type="range"' in html and f"?at={archived - 2}&amp;branch={alt.pk}" in html
    branch_row = html[html.index(f'id="branch-{alt.pk}"'):]
    assert "· archived" not in branch_row[:branch_row.index("</li>")]
    live = client.get(f"/s/{sid}/").content.decode()
    assert 'id="composer"' in live and "Replay at event" not in live
    assert client.get(f"/s/{sid}/", {"at": session.last_event_seq + 1}).status_code == 400
