"""Nothing accepted is lost or silent (docs/contract.md#delivery-and-follow-ups).

Through the API and the tool gateway, with real worker processes: an inbox drains whenever
its branch becomes idle, by whatever path (a turn ending, the cancel of a queued turn,
``manage.py reconcile``); a result or message that cannot be delivered reaches its sender as
one explicit failed result; a start refused on an archived branch writes nothing there.
"""

import subprocess
import sys

import pytest

from tests.collab.test_governed_execution import (
    LONG_MS,
    sender_and_busy_target,
)
from tests.conftest import (
    address_of,
    cancel,
    execution,
    make_spec,
    open_session,
    set_limits,
    settle,
    tool,
    transcript_messages,
    turn,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _turns_and_tip(branch_id) -> tuple[int, str]:
    from collab.models import Branch

    return Branch.objects.values_list("turns", "tip_id").get(pk=branch_id)


def _target_behind_a_queued_turn(team, api_as):
    """A target whose only open job is *queued* (the session's one live slot is taken by a
    slow turn on another branch), and a message waiting in its inbox. Returns
    (api, target session, slow root job, the queued job, the target's address, sender address)."""
    owner = api_as(team.owner)
    set_limits(owner, max_live_per_session=1)
    make_spec(owner, "slow", [{"sleep_ms": LONG_MS}, {"text": "slept"}])
    make_spec(owner, "quiet", [{"text": "quiet: {{prompt}}"}])
    api = api_as(team.member)
    ssid = open_session(api, "quiet", title="sender")
    sender = address_of(api.wait(turn(api, ssid, "hello")))

    tsid = open_session(api, "quiet", title="target")
    root = turn(api, tsid, "hold the live slot", agent_id="slow")
    main = address_of(api.wait(root, {"running"}))
    spawned = tool(api, main, "agent", prompt="first task", agent_id="quiet", description="target",
                   run_in_background=True)
    assert not spawned["is_error"], spawned
    queued = spawned["details"]["execution_id"]
    assert execution(api, queued)["status"] == "queued"
    target = spawned["details"]["address"]

    sent = tool(api, sender, "send_message", to=target, message="please read this")
    assert not sent["is_error"] and sent["details"]["queued"] is True, sent  # the target is busy: its inbox
    return api, tsid, root, queued, target, sender


def _message_turns(target_branch_id):
    from collab.models import Job

    # the prompt as admitted: the job row's until its node is written, then the node's (Job.prompt_text)
    return [(job.pk, job.prompt_text, job.status)
            for job in Job.objects.filter(branch_id=target_branch_id, kind="message").select_related("prompt_msg")]


def test_a_message_whose_targets_only_queued_turn_is_cancelled_is_still_delivered(team, api_as, worker):
    """Cancelling the target's only queued turn makes it idle, and its inbox drains then —
    the message's own turn runs with no later turn on the target."""
    api, tsid, root, queued, target, _ = _target_behind_a_queued_turn(team, api_as)
    target_id = execution(api, queued)["branch"]

    assert cancel(api, queued).status_code == 202
    assert api.wait(queued)["status"] == "cancelled"
    # drained in the cancel's transaction: the message is a turn of its own, waiting for the live slot
    [(message_job, prompt, _)] = _message_turns(target_id)
    assert prompt == "please read this"

    assert cancel(api, root).status_code == 202  # frees the session's live slot; nothing else runs on the target
    done = api.wait(message_job)
    assert done["status"] == "succeeded" and done["kind"] == "message", done
    jobs = settle(api, tsid)
    assert {j["id"]: j["status"] for j in jobs if j["branch"] == target_id} == {queued: "cancelled", message_job: "succeeded"}
    assert "please read this" in transcript_messages(api, target)[-2]["text"]


def test_reconcile_drains_an_idle_branch_with_waiting_messages(team, api_as, worker, process_env):
    """``manage.py reconcile`` drains any branch with no running job whose inbox
    still holds messages, whatever left them there — here the state an earlier release left
    when it cancelled a target's only queued turn without draining (the row is ended directly,
    as that release did)."""
    from collab.models import InboxEntry, Job

    api, tsid, root, queued, target, _ = _target_behind_a_queued_turn(team, api_as)
    target_id = execution(api, queued)["branch"]
    from django.db.models.functions import Now

    assert Job.objects.filter(pk=queued, status="queued").update(status="cancelled", finished_at=Now(), error_code="cancelled")
    # the message waits — unless the workers' own scheduled reconcile has drained it already
    assert InboxEntry.objects.filter(target_branch_id=target_id).count() + len(_message_turns(target_id)) == 1

    # (the workers' own scheduled reconcile may get there first: the same code, either way once)
    out = subprocess.run([sys.executable, str(ROOT / "manage.py"), "reconcile"], env=process_env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    [(message_job, prompt, _)] = _message_turns(target_id)
    assert prompt == "please read this"
    assert cancel(api, root).status_code == 202  # frees the session's live slot
    assert api.wait(message_job)["status"] == "succeeded"
    settle(api, tsid)
    assert len(_message_turns(target_id)) == 1
    assert not InboxEntry.objects.filter(target_branch_id=target_id).exists()


def test_a_message_to_a_target_archived_meanwhile_reaches_the_sender_as_a_failed_result_once(
    team, api_as, worker
):
    """The inbox of a branch archived while the message waited goes back to each
    sender as one failed result (a follow-up that says so), never silently dropped."""
    # the target stays busy until this test cancels its turn (never a timed busy period)
    api, ssid, sender, tsid, busy, target = sender_and_busy_target(team, api_as, LONG_MS, "quiet: {{prompt}}")

    sent = tool(api, sender, "send_message", to=target, message="are you there?")
    assert sent["details"]["queued"] is True, sent
    assert api.post(f"/api/branches/{target}/archive", {"reason": "retired"}).status_code == 200
    assert execution(api, busy)["status"] == "running"  # archive never cancels running work
    assert cancel(api, busy).status_code == 202  # the target's turn ends: its inbox drains now
    assert api.wait(busy)["status"] == "cancelled"
    jobs = settle(api, ssid, tsid)

    target_id = execution(api, busy)["branch"]
    assert not [j for j in jobs if j["branch"] == target_id and j["kind"] == "message" and j["prompt_msg"]]
    failed = [j for j in jobs if j["error_code"] == "archived" and j["kind"] == "message"]
    assert len(failed) == 1 and failed[0]["status"] == "failed" and failed[0]["is_error"], jobs
    followups = [j for j in jobs if j["kind"] == "followup" and j["session"] == ssid]
    assert len(followups) == 1, jobs
    notices = [m for m in transcript_messages(api, sender)
               if m["role"] == "user" and f"did not finish execution {failed[0]['id']}" in m["text"]]
    assert len(notices) == 1 and "archived" in notices[0]["text"] and "is_error=true" in notices[0]["text"]


def test_a_result_to_a_caller_archived_meanwhile_reaches_the_sender_as_a_failed_result_once(
    team, api_as, worker
):
    """A background child's result whose caller branch was archived meanwhile is
    not dropped: the child (the result's sender) gets one failed result saying so, and the
    archived caller is left as it was."""
    owner = api_as(team.owner)
    make_spec(owner, "nap", {"spawn": [{"sleep_ms": 1_500}, {"text": "child result"}],
                             "followup": [{"text": "heard: {{prompt}}"}]})
    make_spec(owner, "quiet", [{"text": "quiet"}])
    api = api_as(team.member)
    sid = open_session(api, "quiet")
    caller = address_of(api.wait(turn(api, sid, "hello")))
    spawned = tool(api, caller, "agent", prompt="work", agent_id="nap", description="child", run_in_background=True)
    assert not spawned["is_error"], spawned
    child_job = spawned["details"]["execution_id"]
    api.wait(child_job, {"running"})
    archived = api.post(f"/api/branches/{caller}/archive", {"reason": "done here"})
    assert archived.status_code == 200
    caller_id = archived.json()["id"]
    before = _turns_and_tip(caller_id)

    assert api.wait(child_job)["status"] == "succeeded"
    jobs = settle(api, sid)
    assert _turns_and_tip(caller_id) == before  # nothing written on it
    bounced = [j for j in jobs if j["error_code"] == "result_undeliverable"]
    assert len(bounced) == 1 and bounced[0]["status"] == "failed", jobs
    child_branch = execution(api, child_job)["branch"]
    followups = [j for j in jobs if j["kind"] == "followup"]
    assert [j["branch"] for j in followups] == [child_branch], jobs
    assert followups[0]["status"] == "succeeded"
    heard = [m for m in transcript_messages(api, address_of(execution(api, child_job)))
             if m["role"] == "user" and f"did not finish execution {bounced[0]['id']}" in m["text"]]
    assert len(heard) == 1 and f"the result of execution {child_job} could not be delivered" in heard[0]["text"]


def test_a_start_refused_on_an_archived_branch_writes_nothing_there(team, api_as, worker):
    """A task accepted while its target was busy, refused at start because the target
    was archived meanwhile, leaves the branch as it was (no prompt node, no turn), and its
    sender hears of it once."""
    from collab.models import Message

    # the target stays busy until this test cancels its turn (never a timed busy period), so the
    # task is accepted while the target is busy and the archive lands before the task can start
    api, ssid, sender, tsid, busy, target = sender_and_busy_target(team, api_as, LONG_MS)
    accepted = tool(api, sender, "agent", to=target, prompt="a task for later")
    task = accepted["details"]["execution_id"]
    assert accepted["details"]["queued"] is True, accepted
    assert api.post(f"/api/branches/{target}/archive", {"reason": "retired"}).status_code == 200
    # the task waits behind the busy turn — or a worker that took it up meanwhile already refused it
    assert execution(api, busy)["status"] == "running" and execution(api, task)["status"] in ("queued", "failed")

    assert cancel(api, busy).status_code == 202  # the target's turn ends: the task may start now
    assert api.wait(busy)["status"] == "cancelled"
    ended = api.wait(task)
    assert ended["status"] == "failed" and ended["error_code"] == "archived"
    settle(api, ssid, tsid)
    assert ended["prompt_msg"] is None and not Message.objects.filter(job_id=task).exists()
    target_id = ended["branch"]
    last = Message.objects.filter(job_id=busy).order_by("-depth").values_list("pk", flat=True)[0]
    assert _turns_and_tip(target_id) == (1, last)  # the busy turn only
    notices = [m for m in transcript_messages(api, sender)
               if m["role"] == "user" and f"did not finish execution {task}" in m["text"]]
    assert len(notices) == 1


def test_fifo_claim_order_and_the_duplicate_window_use_the_database_clock(team, api_as, worker, monkeypatch):
    """Deliveries accepted by app servers whose clocks disagree (here
    this process's clock set ten minutes ahead, then ten minutes behind) still wait, drain and
    run in the order they were accepted, every stored time is the database's, and the 60-s
    duplicate window holds across them."""
    from datetime import timedelta

    from django.db.models.functions import Now
    from django.utils import timezone

    from collab.models import InboxEntry, Job

    owner = api_as(team.owner)
    make_spec(owner, "slow", [{"sleep_ms": LONG_MS}, {"text": "slept"}])
    make_spec(owner, "quiet", [{"text": "quiet: {{prompt}}"}])
    api = api_as(team.member)
    sender = address_of(api.wait(turn(api, open_session(api, "quiet", title="sender"), "hello")))
    tsid = open_session(api, "quiet", title="target")
    busy = turn(api, tsid, "hold the branch", agent_id="slow")
    target = address_of(api.wait(busy, {"running"}))

    real_now = timezone.now

    def app_clock(skew_minutes):
        monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(minutes=skew_minutes))

    app_clock(+10)
    assert tool(api, sender, "send_message", to=target, message="first message")["details"]["queued"] is True
    assert tool(api, sender, "agent", to=target, prompt="first task")["details"]["queued"] is True
    app_clock(-10)
    assert tool(api, sender, "send_message", to=target, message="second message")["details"]["queued"] is True
    assert tool(api, sender, "agent", to=target, prompt="second task")["details"]["queued"] is True
    app_clock(+10)
    again = tool(api, sender, "send_message", to=target, message="second message")
    assert again["is_error"] and again["details"]["code"] == "duplicate_message", again
    monkeypatch.setattr(timezone, "now", real_now)

    target_id = execution(api, busy)["branch"]
    stored = list(InboxEntry.objects.filter(target_branch_id=target_id).annotate(db_now=Now())
                  .values_list("created_at", "db_now"))
    stored += list(Job.objects.filter(branch_id=target_id).annotate(db_now=Now()).values_list("created_at", "db_now"))
    assert len(stored) == 5 and all(abs(db_now - at) < timedelta(minutes=5) for at, db_now in stored), stored

    assert cancel(api, busy).status_code == 202
    settle(api, tsid)
    prompts = [m["text"] for m in transcript_messages(api, target) if m["role"] == "user"]
    order = [next(i for i, text in enumerate(prompts) if text.endswith(p))
             for p in ("first message", "first task", "second message", "second task")]
    assert order == sorted(order), prompts
