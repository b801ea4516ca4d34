"""R3 (docs/contract.md#the-cancel-fence): cancel racing admission and
execution, many iterations → 0 illegal transitions, 0 children running after a confirmed cancel.

Each iteration starts a turn whose one model step calls ``agent(run_in_background=true)`` five
times and cancels it after a random delay: right after the POST (racing the turn's own admission
and claim), or anywhere in the next 1.2 s (racing the claim, the five admissions, the children's
claims and their runs). Whenever the cancel lands:

- no child is created or started after the root was set to stop, and from the moment the cancel
  is answered no child is ``running`` (each is ``stopping``, or ended);
- every child ends cancelled, the root ends cancelled (never succeeded), no follow-up turn runs
  on the cancelled branch, each child's end is a notice there exactly once;
- every job's ``job.*`` events, in the session log's order, follow the legal transitions
  (queued → running | cancelled | failed; running → stopping | a terminal state; stopping →
  cancelled; nothing after a terminal state);
- every transcript is well-formed.

Real django-q2 workers; moved here from tests/collab/test_cancel_fence.py and extended.
"""

import os
import random
import time
from collections import Counter

import pytest

from tests.collab.test_cancel_fence import assert_well_formed, cancel_until_accepted
from tests.collab.test_governed_execution import event_types
from tests.conftest import TERMINAL, agent_call, make_spec, open_session, poll, settle_session, step, turn
from tests.reliability.conftest import size

pytestmark = pytest.mark.slow

WAIT = 60.0
LONG_MS = 30_000  # a model call that is always cancelled long before it ends
ITERATIONS = size(20, 200)
SEED = int(os.environ.get("TRELLIS_RELIABILITY_SEED", "20261201"))

LEGAL = {
    None: {"queued"},
    "queued": {"running", "cancelled", "failed"},
    "running": {"stopping", *TERMINAL},
    "stopping": {"cancelled"},
    **{t: set() for t in TERMINAL},
}


def illegal_transitions(api, sid) -> tuple[list, int]:
    """(the illegal ``job.*`` transitions of the session's log, how many transitions were read)."""
    state: dict[str, str | None] = {}
    illegal, seen = [], 0
    for type_, payload in event_types(api, sid):
        if not type_.startswith("job.") or "job" not in payload:
            continue
        new = type_.removeprefix("job.")
        old = state.get(payload["job"])
        seen += 1
        if new not in LEGAL[old]:
            illegal.append((payload["job"], old, new))
        state[payload["job"]] = new
    return illegal, seen


def _notices(job_id) -> list[dict]:
    from collab.models import Job, Message

    job = Job.objects.get(pk=job_id)
    return list(Message.objects.filter(branch_id=job.branch_id, kind="notice").values("text", "metadata"))


@pytest.mark.timeout(120 + 20 * ITERATIONS)  # a hang guard that grows with the iterations, not a latency bound
def test_cancel_racing_admission_and_a_five_spawn_step_lets_no_child_start_after_it(
    team, api_as, worker, figure
):
    from collab.models import Job

    owner = api_as(team.owner)
    make_spec(owner, "kid", [{"sleep_ms": LONG_MS}, {"text": "kid done"}])
    make_spec(owner, "fan", {"user": [
        step(*[agent_call(f"part {i}", "kid", description=f"kid {i}") for i in range(5)]),
        {"sleep_ms": LONG_MS}, {"text": "all dispatched"},
    ]})
    api = api_as(team.member)
    rng = random.Random(SEED)
    admitted, transitions = Counter(), 0
    for iteration in range(ITERATIONS):
        sid = open_session(api, "fan")
        root = turn(api, sid, f"fan out {iteration}")
        if iteration % 4:  # the race itself: where the cancel lands is the variable
            time.sleep(rng.uniform(0, 1.2))
        answer = cancel_until_accepted(api, root)  # every fourth at once: racing the root's own admission and claim
        assert answer["status"] in ("stopping", "cancelled"), answer
        running = list(Job.objects.filter(parent_job_id=root, status="running").values_list("pk", flat=True))
        assert running == [], (iteration, "a child is running after the cancel was answered")

        assert api.wait(root, timeout=WAIT)["status"] == "cancelled", iteration
        row = Job.objects.get(pk=root)
        fence = row.cancel_requested_at or row.finished_at  # a queued root ends at once
        kids = list(Job.objects.filter(parent_job_id=root))
        admitted[len(kids)] += 1
        assert set(answer["cascaded"]) <= {k.pk for k in kids}
        for kid in kids:
            assert kid.created_at <= fence, (iteration, "a child was admitted after the cancel")
            assert kid.started_at is None or kid.started_at <= fence, (iteration, "a child started after the cancel")
            assert kid.status != "running", (iteration, "a child is running after a confirmed cancel")
            assert api.wait(kid.pk, timeout=WAIT)["status"] == "cancelled", (iteration, kid.pk)

        jobs = settle_session(api, sid, timeout=WAIT)
        assert [j for j in jobs if j["kind"] == "followup"] == [], (iteration, "a follow-up turn ran on the cancelled branch")
        assert {j["status"] for j in jobs} == {"cancelled"}, jobs
        if kids:  # the cascade is visible on the cancelled branch: each child's end, once
            notices = poll(lambda: _notices(root) if len(_notices(root)) >= len(kids) else None,
                           timeout=WAIT, what="the cascade's notices")
            assert sorted(n["metadata"]["result_of"] for n in notices) == sorted(k.pk for k in kids), iteration
        illegal, seen = illegal_transitions(api, sid)
        assert illegal == [], (iteration, illegal)
        transitions += seen
        assert_well_formed(sid)
    figure(f"R3: {ITERATIONS} cancels racing admission and a five-spawn step (children admitted before the "
           f"cancel: {dict(sorted(admitted.items()))}), {transitions} job transitions, 0 illegal, "
           "0 children running after a confirmed cancel")
