"""A mailbox-mode result whose caller branch is archived goes back to its sender, once
(docs/contract.md#results-come-back-exactly-once).

An OpenWork explorer's result is owed to its parent in mode ``mailbox``: it waits for the
parent branch's next turn to drain it. An archived branch never has a next turn, so such a
result is settled instead — marked delivered, one ``followup.undeliverable`` event, and one
failed result (``result_undeliverable``) to the explorer that produced it — whether the
parent was archived while the explorer ran or after it finished but before any drain; and
the reconciler settles one it finds stranded. Driven through user turns of a scripted
OpenWork root, the archive API and ``manage.py reconcile`` against a real worker; rows are
read directly only for what the API does not show (follow-up state, events).
"""

import io

import pytest
from django.core.management import call_command

from tests.collab.test_openwork import (
    agent_message_rows,
    openwork_spec,
    spawn_call,
    user_turn,
)
from tests.conftest import (
    TERMINAL,
    WAIT,
    address_of,
    execution,
    open_session,
    poll,
    settle,
    step,
    tool_results,
    transcript_messages,
)

pytestmark = pytest.mark.slow


def script(sleep_ms):
    """A root that spawns one explorer and answers at once; the explorer takes ``sleep_ms``."""
    return {
        "user": [step(spawn_call("digger", "dig")), {"text": "root done"}],
        "spawn": [{"sleep_ms": sleep_ms}, {"text": "found it"}],
        "followup": [{"text": "heard: {{prompt}}"}],
    }


def spawn_and_answer(api, owner, agent_id, sleep_ms):
    """The root's first turn (spawning the explorer) and the explorer's execution."""
    openwork_spec(owner, agent_id, script(sleep_ms))
    sid = open_session(api, agent_id)
    first = user_turn(api, sid, "start")
    (spawned,) = tool_results(first["id"])
    return sid, first, execution(api, spawned["details"]["execution_id"])


def archive(api, address):
    r = api.post(f"/api/branches/{address}/archive", {"reason": "retired"})
    assert r.status_code == 200, r.content
    return r.json()["id"]


def assert_bounced_once(api, sid, child):
    """The explorer's result is settled (not owed), one ``followup.undeliverable`` event names it,
    one failed ``result_undeliverable`` result exists and reaches the explorer as one turn."""
    from collab.models import Event, Job

    jobs = settle(api, sid, child["session"])
    assert Job.objects.get(pk=child["id"]).followup_state == "delivered"
    events = [e.payload for e in Event.objects.filter(type="followup.undeliverable")]
    assert [(e["job"], e["code"]) for e in events] == [(child["id"], "archived")], events
    bounced = [j for j in jobs if j["error_code"] == "result_undeliverable"]
    assert len(bounced) == 1 and bounced[0]["status"] == "failed", jobs
    followups = [j for j in jobs if j["kind"] == "followup"]
    assert [j["branch"] for j in followups] == [child["branch"]], jobs
    assert followups[0]["status"] == "succeeded", followups
    heard = [m for m in transcript_messages(api, address_of(execution(api, child["id"])))
             if m["role"] == "user" and f"did not finish execution {bounced[0]['id']}" in m["text"]]
    assert len(heard) == 1, heard
    assert f"the result of execution {child['id']} could not be delivered" in heard[0]["text"]
    assert agent_message_rows(sid) == []  # nothing was drained into the archived parent
    return jobs


def test_an_explorer_result_to_a_parent_archived_while_it_ran_goes_back_once(team, api_as, worker):
    """The parent branch is archived while its explorer runs;
    when the explorer finishes its result is not left owed but bounced to it once."""
    owner, api = api_as(team.owner), api_as(team.member)
    sid, first, child = spawn_and_answer(api, owner, "mbx1", 3_000)
    assert child["status"] not in TERMINAL, child  # the scenario: archived while the explorer runs
    archive(api, address_of(first))
    assert api.wait(child["id"], timeout=WAIT)["status"] == "succeeded"
    assert_bounced_once(api, sid, child)


def test_a_finished_explorer_result_goes_back_once_when_its_parent_is_archived(team, api_as, worker):
    """The explorer finished after the parent's answer, so its
    result waits owed for the parent's next turn; archiving the parent settles it at once, and
    archiving again bounces nothing more."""
    from collab.models import Job

    owner, api = api_as(team.owner), api_as(team.member)
    sid, first, child = spawn_and_answer(api, owner, "mbx2", 0)
    assert api.wait(child["id"], timeout=WAIT)["status"] == "succeeded"
    settle(api, sid, child["session"])
    assert Job.objects.get(pk=child["id"]).followup_state == "owed"  # the scenario: no drain yet
    archive(api, address_of(first))
    jobs = assert_bounced_once(api, sid, child)
    archive(api, address_of(first))
    assert [j["id"] for j in settle(api, sid, child["session"])] == [j["id"] for j in jobs]
    assert_bounced_once(api, sid, child)


def test_reconcile_settles_a_mailbox_result_stranded_on_an_archived_branch_once(team, api_as, worker):
    """A mailbox result found owed to an archived branch (its settling
    was lost: simulated by archiving the row directly) is settled by the reconciler, once however
    often it runs."""
    from django.db.models.functions import Now

    from collab.models import Branch, Job

    owner, api = api_as(team.owner), api_as(team.member)
    sid, first, child = spawn_and_answer(api, owner, "mbx3", 0)
    assert api.wait(child["id"], timeout=WAIT)["status"] == "succeeded"
    settle(api, sid, child["session"])
    Branch.objects.filter(pk=first["branch"]).update(archived=True, archived_at=Now())  # archived, nothing settled
    assert Job.objects.get(pk=child["id"]).followup_state == "owed"

    def reconciled():  # the reconciler leaves a debt younger than a few seconds to its delivery
        call_command("reconcile", stdout=io.StringIO())
        return Job.objects.get(pk=child["id"]).followup_state != "owed"

    poll(reconciled, timeout=WAIT, interval=0.5, what="the reconciler to settle the stranded result")
    call_command("reconcile", stdout=io.StringIO())
    assert_bounced_once(api, sid, child)
