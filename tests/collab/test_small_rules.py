"""The small rules written once, tested in this process without workers:
the branch address, the busy/occupied rules, the effective agent spec, the head+tail bound, the
turn's policy and the one failure path."""

from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.utils import timezone

from collab.deliveries import notice_lead
from collab.errors import NotFound
from collab.models import Branch, Job, Session, effective_spec, format_address, is_busy, is_occupied
from collab.models.branches import NO_ADDRESS
from collab.runtime.failures import (
    CANCELLED,
    LimitExceeded,
    ToolCallLimit,
    TurnStopped,
    end_failed,
    failure_of,
)
from collab.runtime.policy import (
    DOOM_LOOP_THRESHOLD,
    EXPLORER_MAX_MODEL_CALLS,
    OPENWORK_MAX_MODEL_CALLS,
    DoomLoop,
    TurnPolicy,
    policy_for,
)
from collab.runtime.providers import ProviderError
from collab.selectors.specs import spec_by_agent_id
from collab.services.acting import Actor, message_header, task_header
from collab.text import OMISSION_MARKER, RESULT_LIMIT, BoundedStream, bound_text

# --- the branch address (docs/contract.md#addresses) -----------------------------------------


def test_an_address_is_sid_colon_head_and_none_without_a_head():
    assert format_address("S1", "M9") == "S1:M9"
    assert format_address("S1", None) is None
    assert format_address("S1", "") is None


@pytest.fixture
def session(team):
    from collab.services.sessions import do_create_session

    return do_create_session(team.member, team.alpha, title="rules")


@pytest.fixture
def main(session):
    return Branch.objects.select_related("session").get(session=session)


def test_a_branch_without_a_message_has_no_address_anywhere(team, session, main):
    """One answer for an empty branch, whoever asks: the branch, an agent acting as it, a
    result notice — never a bare SID or "SID:None" that no resolver accepts."""
    assert main.tip_id is None and main.address is None
    assert Actor(user=team.member, session=session, branch=main).address is None
    for text in (task_header(None), message_header(None), notice_lead(None, "main", "J1", None)):
        assert NO_ADDRESS in text and "None" not in text and f"{session.pk}]" not in text


def test_a_branch_with_a_message_is_addressed_by_its_tip(team, session, main):
    from collab.services.messages import append_message

    append_message(main, role="user", text="hello")
    main.refresh_from_db()
    assert main.address == f"{session.pk}:{main.tip_id}"
    assert Actor(user=team.member, session=session, branch=main).address == main.address
    assert task_header(main.address).startswith(f"[task from {main.address}]")
    assert f'send_message(to="{main.address}"' in message_header(main.address)


# --- busy and occupied ------------------------------------------------------------------------


def _job(session: Session, branch: Branch, status: str) -> Job:
    now = timezone.now()
    return Job.objects.create(
        project_id=session.project_id, session=session, branch=branch, kind="user", status=status,
        started_at=None if status == "queued" else now,
        finished_at=now if status in ("succeeded", "failed", "cancelled", "interrupted") else None,
    )


@pytest.mark.parametrize(("status", "busy", "occupied"), [
    (None, False, False),
    ("queued", False, True),
    ("running", True, True),
    ("stopping", True, True),
    ("succeeded", False, False),
    ("cancelled", False, False),
])
def test_busy_means_a_turn_in_progress_and_occupied_counts_queued_work(session, main, status, busy, occupied):
    if status:
        _job(session, main, status)
    assert is_busy(main) is busy
    assert is_occupied(main) is occupied
    assert Job.objects.running().filter(branch=main).exists() is busy
    assert Job.objects.open().filter(branch=main).exists() is occupied


def test_the_branch_rows_busy_flag_is_the_busy_rule(session, main):
    from collab.selectors.agents import branch_rows
    from collab.services.messages import append_message

    append_message(main, role="user", text="hello")  # listed branches have a message
    _job(session, main, "queued")
    assert [b.busy for b in branch_rows([session.pk], archived=False)] == [False]
    Job.objects.filter(branch=main).update(status="running", started_at=timezone.now())
    assert [b.busy for b in branch_rows([session.pk], archived=False)] == [True]


# --- the effective agent spec -------------------------------------------------------------------


def test_a_branch_runs_its_own_spec_else_its_sessions(team, session, main):
    from collab.models import AgentSpec

    default = AgentSpec.objects.create(project=team.alpha, agent_id="default")
    own = AgentSpec.objects.create(project=team.alpha, agent_id="own")
    assert effective_spec(main) is None
    Session.objects.filter(pk=session.pk).update(agent_spec=default)
    main = Branch.objects.select_related("session__agent_spec").get(pk=main.pk)
    assert effective_spec(main) == default and main.effective_spec == default
    main.agent_spec = own
    assert effective_spec(main) == own
    assert effective_spec(Branch(session=session), SimpleNamespace(agent_spec=default)) == default


def test_a_spec_is_looked_up_by_agent_id_in_its_project_only(team):
    from collab.models import AgentSpec

    spec = AgentSpec.objects.create(project=team.alpha, agent_id="bot")
    assert spec_by_agent_id(team.alpha.pk, "bot") == spec
    for project, agent_id in ((team.beta.pk, "bot"), (team.alpha.pk, "nobody")):
        with pytest.raises(NotFound) as caught:
            spec_by_agent_id(project, agent_id)
        assert caught.value.code == "unknown_agent_id" and repr(agent_id) in caught.value.detail


# --- bounded text: head and tail (docs/contract.md#results) --------------------------------------


def test_a_text_that_fits_is_kept_whole():
    assert bound_text("short") == ("short", False)
    exact = "x" * RESULT_LIMIT
    assert bound_text(exact) == (exact, False)


@pytest.mark.parametrize("limit", [RESULT_LIMIT, 4000, 200])
def test_a_long_text_keeps_two_thirds_head_and_one_third_tail_within_the_bound(limit):
    text = "".join(f"{n:07d}\n" for n in range(20_000))  # 160,000 characters, every slice distinct
    bounded, truncated = bound_text(text, limit)
    assert truncated and len(bounded) <= limit
    head, marker_and_tail = bounded.split("\n\n[…", 1)
    omitted = int(marker_and_tail.split(" characters omitted", 1)[0])
    tail = bounded[len(head) + len(OMISSION_MARKER.format(omitted=omitted)):]
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + omitted + len(tail) == len(text)
    assert abs(len(head) - 2 * len(tail)) <= 2


def test_a_streamed_text_is_bounded_exactly_like_the_whole():
    text = "".join(f"line {n}\n" for n in range(10_000))
    for piece in (1, 7, 4096, len(text)):
        stream = BoundedStream(3000)
        for start in range(0, len(text), piece):
            stream.add(text[start:start + piece])
        assert stream.text() == bound_text(text, 3000)[0]
    small = BoundedStream(3000)
    small.add("abc")
    small.add("def")
    assert small.text() == "abcdef"


def test_an_events_copy_of_a_long_message_is_bounded_head_and_tail():
    from collab.events import MAX_TEXT_IN_EVENT, clip

    text = "HEAD" + "x" * 10_000 + "TAIL"
    clipped = clip(text)
    assert clipped["text_truncated"] and clipped["text_length"] == len(text)
    assert len(clipped["text"]) <= MAX_TEXT_IN_EVENT
    assert clipped["text"].startswith("HEAD") and clipped["text"].endswith("TAIL")
    assert clip("small") == {"text": "small"}


# --- the turn's policy ---------------------------------------------------------------------------


def test_an_explorer_and_an_openwork_root_are_bounded_and_a_collab_turn_is_not():
    assert policy_for("explorer", "openwork", None) == TurnPolicy(EXPLORER_MAX_MODEL_CALLS, DOOM_LOOP_THRESHOLD)
    assert policy_for("general", "openwork", None) == TurnPolicy(OPENWORK_MAX_MODEL_CALLS, DOOM_LOOP_THRESHOLD)
    custom = SimpleNamespace(limits={"max_model_calls": 5})
    assert policy_for("general", "openwork", custom).max_model_calls == 5
    assert policy_for("general", "openwork", SimpleNamespace(limits={"max_model_calls": 0})).max_model_calls == 20
    assert policy_for("general", "collab", custom) == TurnPolicy(None, None)


def test_the_model_call_cap_ends_the_turn_as_max_model_calls():
    TurnPolicy(3, None).enforce_model_calls(2)
    TurnPolicy(None, None).enforce_model_calls(10_000)
    with pytest.raises(LimitExceeded) as caught:
        TurnPolicy(3, None).enforce_model_calls(3)
    assert caught.value.code == "max_model_calls"


def test_the_tool_call_cap_is_a_limit_with_its_own_code(settings):
    settings.TRELLIS_MAX_TOOL_CALLS = 4
    TurnPolicy.enforce_tool_calls(2, 2)
    with pytest.raises(ToolCallLimit) as caught:
        TurnPolicy.enforce_tool_calls(2, 3)
    assert isinstance(caught.value, LimitExceeded) and caught.value.code == "tool_call_limit"


def _call(name, **arguments):
    return SimpleNamespace(name=name, arguments=arguments)


def test_three_identical_calls_in_a_row_are_a_doom_loop_and_wait_agent_is_not_counted():
    loop = DoomLoop(3)
    loop.enforce([_call("read", path="a"), _call("wait_agent"), _call("read", path="a")])
    loop.enforce([_call("read", path="b")])  # a different call breaks the streak
    loop.enforce([_call("read", path="b")])
    with pytest.raises(LimitExceeded) as caught:
        loop.enforce([_call("read", path="b")])
    assert caught.value.code == "doom_loop"
    DoomLoop(None).enforce([_call("read", path="a")] * 10)  # no threshold: never


def test_three_wait_agent_timeouts_in_a_row_are_a_doom_loop_and_a_delivery_resets_them():
    loop = DoomLoop(3)
    for delivered in (False, False, True, False, False):
        loop.count_wait(delivered)
    loop.enforce([])
    loop.count_wait(False)
    with pytest.raises(LimitExceeded, match="wait_agent timed out 3 times"):
        loop.enforce([])


# --- the one failure path -----------------------------------------------------------------------


@pytest.mark.parametrize(("exc", "status", "code", "result"), [
    (TurnStopped("stopping"), "cancelled", "cancelled", "cancelled"),
    (LimitExceeded("quota.tokens_exhausted", "too many tokens"), "failed", "quota.tokens_exhausted", "too many tokens"),
    (ToolCallLimit("too many calls"), "failed", "tool_call_limit", "too many calls"),
    (ProviderError("the model said no", code="provider_http_error"), "failed", "provider_http_error", "the model said no"),
    (KeyError("boom"), "failed", "internal_error", "internal error: KeyError"),
])
def test_every_way_a_turn_fails_ends_its_job_through_one_path(session, main, exc, status, code, result):
    failure = failure_of(exc, "J1")
    assert (failure.status, failure.code, failure.result) == (status, code, result)
    job = _job(session, main, "running")
    end_failed(job, failure, usage={"model_calls": 2, "tool_calls": 1, "tokens_in": 5, "tokens_out": 7,
                                    "cost": Decimal("0.5")})
    job.refresh_from_db()
    assert (job.status, job.error_code, job.result_text, job.is_error) == (status, code, result, True)
    assert job.error_reason == failure.reason and job.finished_at is not None
    assert (job.model_calls, job.tokens_out) == (2, 7)
    assert CANCELLED.reason == "the execution was cancelled"


def test_a_turn_over_its_tool_call_cap_fails_with_that_code_and_its_usage(team, scripted_session, settings):
    """The loop raises, the one failure path ends the job: observed as a client sees it."""
    from collab.runtime.loop import run_job

    settings.TRELLIS_MAX_TOOL_CALLS = 1
    unknown = {"name": "no_such_tool", "arguments": {}}
    api, sid = scripted_session(team.member, [{"tool_calls": [unknown, unknown]}, {"text": "never"}])
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"})
    assert r.status_code == 202, r.content
    assert run_job(r.json()["execution_id"]) == "failed"
    done = api.get(f"/api/executions/{r.json()['execution_id']}").json()
    assert (done["status"], done["error_code"], done["is_error"]) == ("failed", "tool_call_limit", True)
    assert done["result"] == "the turn reached its limit of 1 tool calls"
    assert done["model_calls"] == 1 and done["tool_calls"] == 0
