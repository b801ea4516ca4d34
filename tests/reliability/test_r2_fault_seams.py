"""R2 (docs/contract.md#delivery-and-follow-ups): a worker dies at the seams where a
delivery could be lost or doubled → each delivery arrives exactly once.

The seams are real code paths, reached by real turns on real worker machines; the fault is a
SIGKILL of the process at that point (``collab.faults.fault_point``, armed through the machines'
``TRELLIS_FAULT_DIR``) — no mock, no hand-edited row:

- ``inbox.delivered``: a waiting message has been admitted as its recipient's turn but its inbox
  entry is not yet deleted. Armed twice: the first death is the worker completing the recipient's
  cancelled turn, the second the reconciler that recovers that turn (it drains the same inbox).
- ``followup.owed``: a background child's completion is committed and its result owed to the
  caller, but its delivery has not begun.
- ``followup.admitted``: the follow-up turn is admitted and the debt marked delivered, not yet
  committed.

Afterwards: the message is one turn of its recipient (and its inbox empty); the child's result
is in its caller's transcript once; nothing is left owed; every transcript is well-formed.
"""

import pytest
from django.db.models import Q

from tests.collab.test_cancel_fence import assert_well_formed
from tests.collab.test_governed_execution import (
    address_of, agent_call, cancel, make_spec, open_session, step, tool, turn,
)
from tests.conftest import poll, settle_session
from tests.reliability.conftest import WAIT, size

pytestmark = pytest.mark.slow

ITERATIONS = size(1, 10)
UNENDING_MS = 600_000


def _copies_of_result(job_id: str) -> int:
    from collab.models import Message

    return Message.objects.filter(Q(metadata__followup_of=job_id) | Q(metadata__result_of=job_id)).count()


@pytest.mark.timeout(240 + 60 * ITERATIONS)
def test_a_worker_dying_between_inbox_delivery_and_delete_delivers_the_message_once(
    team, api_as, machines, faults, figure
):
    from collab.models import InboxEntry, Job

    owner = api_as(team.owner)
    make_spec(owner, "quiet", [{"text": "quiet"}])
    make_spec(owner, "busy", {"user": [{"sleep_ms": UNENDING_MS}], "message": [{"text": "read: {{prompt}}"}]})
    machines.start()
    machines.start()
    api = api_as(team.member)
    sender = address_of(api.wait(turn(api, open_session(api, "quiet", title="sender"), "hello"), timeout=WAIT))
    before = len(faults.fired("inbox.delivered"))
    delivered = 0
    for i in range(ITERATIONS):
        tsid = open_session(api, "busy", title=f"target {i}")
        busy = turn(api, tsid, "hold the branch")
        target = address_of(api.wait(busy, {"running"}, timeout=WAIT))
        text = f"note {i}"
        sent = tool(api, sender, "send_message", to=target, message=text)
        assert not sent["is_error"] and sent["details"]["queued"] is True, sent  # it waits in the inbox
        faults.arm("inbox.delivered")  # the worker confirming the cancel dies in the drain…
        faults.arm("inbox.delivered")  # …and so does the reconciler that ends that turn for it
        assert cancel(api, busy).status_code == 202

        ended = api.wait(busy, timeout=WAIT)
        assert ended["status"] == "cancelled", ended
        settle_session(api, tsid, timeout=WAIT)
        target_id = ended["branch"]
        messages = [(job.prompt_text, job.status)  # the prompt as admitted (the node holds it once written)
                    for job in Job.objects.filter(branch_id=target_id, kind="message").select_related("prompt_msg")]
        assert messages == [(text, "succeeded")], messages
        assert not InboxEntry.objects.filter(target_branch_id=target_id).exists()
        assert_well_formed(tsid)
        delivered += len(messages)
    deaths = len(faults.fired("inbox.delivered")) - before
    faults.disarm()
    figure(f"R2 inbox: {ITERATIONS} messages, {deaths} workers killed between delivery and delete, "
           f"{delivered} delivered, {ITERATIONS - delivered} lost, 0 doubled")
    assert deaths >= ITERATIONS  # the seam was really hit (a reconciler outside this test may take the second)


@pytest.mark.timeout(240 + 60 * ITERATIONS)
@pytest.mark.parametrize("seam", ["followup.owed", "followup.admitted"])
def test_a_worker_dying_between_a_jobs_completion_and_its_followup_delivers_the_result_once(
    team, api_as, machines, faults, figure, seam
):
    from collab.models import Job

    owner = api_as(team.owner)
    make_spec(owner, "kid", [{"sleep_ms": 300}, {"text": "kid answer: {{prompt}}"}])
    make_spec(owner, "boss", {"user": [step(agent_call("the task", "kid", description="kid")), {"text": "dispatched"}],
                              "followup": [{"text": "heard"}]})
    machines.start()
    machines.start()
    api = api_as(team.member)
    before = len(faults.fired(seam))
    once = 0
    for i in range(ITERATIONS):
        sid = open_session(api, "boss", title=f"caller {i}")
        faults.arm(seam)
        root = turn(api, sid, f"delegate {i}")
        kid = poll(lambda: Job.objects.filter(parent_job_id=root).first(), timeout=WAIT, what="the child")
        poll(lambda: len(faults.fired(seam)) > before + i, timeout=WAIT, what=f"a worker to die at {seam}")
        jobs = settle_session(api, sid, timeout=WAIT)
        kid = Job.objects.get(pk=kid.pk)
        assert kid.status == "succeeded" and kid.followup_state == "delivered", (kid.status, kid.followup_state)
        assert _copies_of_result(kid.pk) == 1, [j for j in jobs if j["kind"] == "followup"]
        assert not Job.objects.filter(session_id=sid, followup_state="owed").exists()
        assert_well_formed(sid)
        once += 1
    deaths = len(faults.fired(seam)) - before
    figure(f"R2 {seam}: {ITERATIONS} results, {deaths} workers killed at the seam, {once} delivered once, "
           f"{ITERATIONS - once} lost or doubled")
    assert deaths == ITERATIONS
