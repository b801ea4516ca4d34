"""OpenWork exactness (docs/contract.md#the-openwork-toolset).

- task names are unique per ROOT session (not per parent branch), backed by a unique index;
- a delivered explorer message of 4,000 tokens or more is refused as ``agent_delivery_failed``
  (the parent is told, never left waiting);
- error-code precedence: ``duplicate_task_name`` before ``agent_limit_reached``
  for ``spawn_agent``, ``agent_turn_start_failed`` (child running) before ``agent_limit_reached``
  for ``followup_task``;
- ``interrupt_agent`` goes through the versioned ``execution.cancel`` command (an
  ExecutionCommand is recorded, like a cancel from the UI or the API).

Through the tool gateway and real worker turns, on PostgreSQL and SQLite.
"""

import pytest

from collab.models import Branch, ExecutionCommand, Job, Session
from tests.collab.test_openwork import (
    call,
    envelopes,
    openwork_spec,
    refused,
    spawn_call,
    user_turn,
)
from tests.conftest import (
    WAIT,
    open_session,
    step,
    tool,
    transcript_messages,
)


def queued_root(api, owner, agent_id="ow"):
    """An OpenWork root session with a first turn (queued: no worker) and its address."""
    openwork_spec(owner, agent_id, [])
    sid = open_session(api, agent_id)
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
    return sid, f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"


def test_task_names_are_unique_per_root_session_across_its_branches(team, api_as, client):
    """A task_name is unique within its root session: a second branch of the same root session (a fork)
    cannot spawn a child under a name its sibling branch already uses; the unique index on the
    child sessions backs the check up."""
    from django.db import IntegrityError, transaction

    owner, api = api_as(team.owner), api_as(team.member)
    sid, main = queued_root(api, owner)
    assert not tool(api, main, "spawn_agent", task_name="scout", message="look")["is_error"]

    client.force_login(team.member)
    head = main.split(":")[1]
    assert client.post(f"/s/{sid}/m/{head}/fork", {"prompt": "another line"}).status_code == 302
    fork = Branch.objects.filter(session_id=sid, task_name__isnull=True).order_by("-created_at").first()
    assert fork.address != main
    before = (Session.objects.count(), Branch.objects.count(), Job.objects.count())
    refused(tool(api, fork.address, "spawn_agent", task_name="scout", message="again"), "duplicate_task_name")
    assert (Session.objects.count(), Branch.objects.count(), Job.objects.count()) == before
    assert not tool(api, fork.address, "spawn_agent", task_name="scout_two", message="other")["is_error"]

    root = Session.objects.get(pk=sid)
    assert Session.objects.get(parent_session=root, task_name="scout")
    with pytest.raises(IntegrityError), transaction.atomic():
        Session.objects.create(project=root.project, parent_session=root, agent_role="explorer", task_name="scout")


def test_spawn_reports_duplicate_task_name_before_agent_limit_reached(team, api_as):
    """With every slot taken, a spawn under a name already in use answers
    duplicate_task_name (the name is checked before the slot); a fresh name agent_limit_reached."""
    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.patch("/api/projects/alpha/limits", {"max_active_turns": 1}).status_code == 200
    sid, main = queued_root(api, owner)
    assert not tool(api, main, "spawn_agent", task_name="one", message="busy")["is_error"]  # queued: holds the slot
    refused(tool(api, main, "spawn_agent", task_name="one", message="same name"), "duplicate_task_name")
    refused(tool(api, main, "spawn_agent", task_name="two", message="no slot"), "agent_limit_reached")


def test_followup_on_a_running_child_is_agent_turn_start_failed_before_the_limit(team, api_as):
    """followup_task on a child whose turn is still open answers
    agent_turn_start_failed even when the slots are all taken (its own turn holds one);
    an idle child with no free slot answers agent_limit_reached."""
    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.patch("/api/projects/alpha/limits", {"max_active_turns": 1}).status_code == 200
    sid, main = queued_root(api, owner)
    assert not tool(api, main, "spawn_agent", task_name="busy", message="work")["is_error"]
    refused(tool(api, main, "followup_task", task_name="busy", message="more"), "agent_turn_start_failed")
    refused(tool(api, main, "followup_task", task_name="nobody", message="more"), "unknown_agent")


def test_interrupt_agent_records_a_versioned_cancel_command(team, api_as):
    """interrupt_agent is the execution.cancel command — an ExecutionCommand with its
    command id and the version it expected is recorded, the cancel event names it, and the child's
    queued turn ends cancelled without starting; a second interrupt finds nothing to interrupt."""
    owner, api = api_as(team.owner), api_as(team.member)
    sid, main = queued_root(api, owner)
    spawned = tool(api, main, "spawn_agent", task_name="kid", message="work")
    job_id = spawned["details"]["execution_id"]
    version = Job.objects.get(pk=job_id).version
    result = tool(api, main, "interrupt_agent", task_name="kid")
    assert not result["is_error"] and result["text"] == "Interrupt requested", result
    command = ExecutionCommand.objects.get(job_id=job_id)
    assert command.action == "execution.cancel" and command.expected_version == version
    assert command.command_id.startswith(f"{job_id}:interrupt_agent:")
    assert command.response["status"] == "cancelled"
    assert Job.objects.get(pk=job_id).status == "cancelled"
    events = api.get(f"/api/sessions/{Job.objects.get(pk=job_id).session_id}/events").json()["events"]
    assert any(e["type"] == "execution.cancel_requested" and e["payload"]["command_id"].startswith("interrupt_agent:")
               for e in events), events
    refused(tool(api, main, "interrupt_agent", task_name="kid"), "agent_interrupt_failed")


def test_interrupt_agent_needs_the_right_to_cancel(team, api_as):
    """A member who did not start the branch cannot act as it through the
    gateway at all (403), so cannot interrupt its child; no command is recorded."""
    owner, api = api_as(team.owner), api_as(team.member)
    sid, main = queued_root(api, owner)
    job_id = tool(api, main, "spawn_agent", task_name="kid", message="work")["details"]["execution_id"]
    other = team.member.__class__.objects.create_user(username="member2", password="pw-secret-123")
    from accounts.models import Membership

    Membership.objects.create(user=other, project=team.alpha, role="member")
    r = api_as(other).post(f"/api/branches/{main}/tools/interrupt_agent", {"arguments": {"task_name": "kid"}})
    assert r.status_code == 403 and r.json()["code"] == "forbidden", r.content
    assert not ExecutionCommand.objects.filter(job_id=job_id).exists()
    assert Job.objects.get(pk=job_id).status == "queued"


@pytest.mark.slow
def test_an_explorer_message_of_4000_tokens_is_refused_as_agent_delivery_failed(team, api_as, worker):
    """An envelope estimated at 4,000 tokens or more (~4 characters a token) is not
    delivered; the parent reads a failed envelope ``agent_delivery_failed: …`` naming the
    execution instead, in the same turn (it never waits for nothing). A message just under the
    cap arrives whole."""
    owner, api = api_as(team.owner), api_as(team.member)
    under, over = "u" * 15_800, "o" * 16_100
    openwork_spec(owner, "cap", {
        "user": [step(spawn_call("small", under), spawn_call("large", over)),
                 # the children answer at once and run side by side: both results may be drained
                 # before the first wait, which then waits for nothing until its timeout
                 step(call("wait_agent", timeout_ms=20_000)),
                 step(call("wait_agent", timeout_ms=10_000)),  # the other one, if not drained with the first
                 {"text": "mail=[{{mailbox}}]"}],
        "spawn": [{"text": "{{prompt}}"}],
    })
    sid = open_session(api, "cap")
    root = user_turn(api, sid, "go")
    final = transcript_messages(api, f"{sid}:{root['prompt_msg']}")[-1]["text"]
    found = {task: (kind, body) for task, kind, body in envelopes(final)}
    assert found["small"] == ("final_answer", under), {k: (v[0], len(v[1])) for k, v in found.items()}
    kind, body = found["large"]
    assert kind == "failed" and body.startswith("agent_delivery_failed: ") and over not in body
    large = Job.objects.get(branch__task_name="large", session__parent_session_id=sid)
    assert large.status == "succeeded" and large.pk in body  # the child's own result is unchanged
    assert api.wait(large.pk, timeout=WAIT)["result"] == over
