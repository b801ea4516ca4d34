"""Fair share (docs/capacity.md#fair-share): the operator's ceilings bound every project's limits,
and a per-project cap on running jobs keeps one project's queue from starving the others."""

import io
import re
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from accounts.models import Project
from collab.models import Job
from tests.conftest import poll


def with_ceilings(settings, **ceilings):
    settings.TRELLIS_LIMIT_CEILINGS = {**settings.TRELLIS_LIMIT_CEILINGS, **ceilings}


def spec(owner, project, agent_id, script):
    r = owner.post(f"/api/projects/{project}/agent-specs", {"agent_id": agent_id, "provider": "scripted", "script": script})
    assert r.status_code == 201, r.content


def turn(api, sid, prompt="go"):
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt})
    assert r.status_code == 202, r.content
    return r.json()["execution_id"]


def session(api, project, agent_id):
    r = api.post(f"/api/projects/{project}/sessions", {"title": "fair", "agent_id": agent_id})
    assert r.status_code == 201, r.content
    return r.json()["id"]


def test_a_limit_above_the_operators_ceiling_is_refused_naming_it(team, api_as, settings):
    """Above a ceiling, or 0 ("unlimited") under a finite one, is a 400 ``invalid_limit``
    naming the ceiling's variable; nothing changes. Null inherits the ceiling."""
    with_ceilings(settings, max_messages=4, max_live_per_session=2, max_cost_per_job=Decimal("1.5"), max_running_jobs=2)
    owner = api_as(team.owner)
    before = owner.get("/api/projects/alpha/limits").json()
    assert before["ceilings"]["max_messages"] == 4 and before["ceilings"]["max_cost_per_job"] == "1.5"
    assert before["max_messages"] == 8 and before["effective"]["max_messages"] == 4  # the default row, capped

    for field, value, variable in (("max_messages", 5, "TRELLIS_MAX_MESSAGES"), ("max_messages", 0, "TRELLIS_MAX_MESSAGES"),
                                   ("max_live_per_session", 3, "TRELLIS_MAX_LIVE_PER_SESSION"),
                                   ("max_cost_per_job", "2", "TRELLIS_MAX_COST_PER_JOB"),
                                   ("max_running_jobs", 3, "TRELLIS_MAX_RUNNING_PER_PROJECT")):
        r = owner.patch("/api/projects/alpha/limits", {field: value})
        assert r.status_code == 400, (field, value, r.content)
        body = r.json()
        assert body["code"] == "invalid_limit" and body["field"] == field and variable in body["detail"], body
        assert "ceiling" in body
    assert owner.get("/api/projects/alpha/limits").json() == before

    r = owner.patch("/api/projects/alpha/limits", {"max_messages": 3, "max_live_per_session": None, "max_running_jobs": 1})
    assert r.status_code == 200, r.content
    limits = r.json()
    assert limits["effective"]["max_messages"] == 3
    assert limits["max_live_per_session"] is None and limits["effective"]["max_live_per_session"] == 2
    assert limits["effective"]["max_running_jobs"] == 1

    # the operator's command obeys the same ceilings
    with pytest.raises(CommandError, match="TRELLIS_MAX_MESSAGES"):
        call_command("limits", "alpha", "max_messages=0", stdout=io.StringIO())


def test_a_row_set_before_the_ceiling_was_lowered_is_capped_at_admission(team, api_as, settings, scripted_session):
    """The value in force is min(project, ceiling), whatever the row says."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    Project.objects.filter(slug="alpha").update(max_jobs_per_session=50)  # allowed when it was set
    with_ceilings(settings, max_jobs_per_session=2)
    assert api.get("/api/projects/alpha/limits").json()["effective"]["max_jobs_per_session"] == 2
    turn(api, sid, "one")
    turn(api, sid, "two")
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "three"})
    assert r.status_code == 429 and r.json()["code"] == "quota.jobs_exhausted", r.content
    assert Job.objects.filter(session_id=sid).count() == 2


@pytest.mark.slow
def test_a_sleep_ms_step_ends_at_the_runtime_ceiling(team, api_as, settings, run_queued):
    """A scripted ``sleep_ms`` of ten minutes, in a project with no runtime limit of its
    own, ends at the operator's runtime ceiling. The child of a gateway ``agent`` call runs as a
    worker runs it, here in this process (``run_queued``), whose settings carry the ceiling."""
    owner = api_as(team.owner)
    assert owner.patch("/api/projects/alpha/limits", {"max_runtime_seconds": None}).status_code == 200
    spec(owner, "alpha", "bot", [{"text": "ready"}])
    spec(owner, "alpha", "sleeper", [{"sleep_ms": 600_000}, {"text": "never"}])
    api = api_as(team.member)
    sid = session(api, "alpha", "bot")
    assert api.wait(turn(api, sid))["status"] == "succeeded"
    address = api.get(f"/api/sessions/{sid}/branches").json()[0]["address"]

    with_ceilings(settings, max_runtime_seconds=1)
    r = api.post(f"/api/branches/{address}/tools/agent",
                 {"arguments": {"prompt": "sleep", "agent_id": "sleeper", "description": "sleeper"}})
    assert r.status_code == 200, r.content
    child = api.get(f"/api/executions/{r.json()['details']['execution_id']}").json()
    assert child["status"] == "failed" and child["error_code"] == "quota.runtime_exceeded", child


@pytest.mark.slow
def test_one_projects_queue_does_not_keep_another_projects_turn_from_starting(team, api_as, worker):
    """With a running cap of 1 in project alpha and a worker of 2 slots, alpha's three long
    turns run one at a time; beta's turns start and finish while two of alpha's wait queued (a free
    slot does not go to a capped project), and a queued alpha turn starts when the running one ends."""
    owner, outsider = api_as(team.owner), api_as(team.outsider)
    assert owner.patch("/api/projects/alpha/limits", {"max_running_jobs": 1}).status_code == 200
    spec(owner, "alpha", "long", [{"sleep_ms": 120_000}, {"text": "done"}])
    spec(outsider, "beta", "quick", [{"text": "beta answers"}])
    member = api_as(team.member)
    alpha_jobs = [turn(member, session(member, "alpha", "long"), f"long {n}") for n in range(3)]
    beta_sid = session(outsider, "beta", "quick")

    def alpha_states():
        return sorted(Job.objects.filter(pk__in=alpha_jobs).values_list("status", flat=True))

    poll(lambda: alpha_states() == ["queued", "queued", "running"], what="one alpha turn running")
    for prompt in ("first", "second"):  # each finishes while alpha's other two still wait
        done = outsider.wait(turn(outsider, beta_sid, prompt))
        assert done["status"] == "succeeded", done
        assert alpha_states() == ["queued", "queued", "running"]

    running = Job.objects.get(pk__in=alpha_jobs, status="running")
    r = member.post(f"/api/executions/{running.pk}/commands",
                    {"command_id": "stop-1", "action": "execution.cancel", "expected_version": running.version, "payload": {}})
    assert r.status_code == 202, r.content
    member.wait(running.pk)
    # the next alpha turn starts, and only one: never past the cap
    poll(lambda: alpha_states() == ["cancelled", "queued", "running"], what="the next alpha turn running")


# --- waking a job declined for the cap (one hand-off per decline) -----------------------------
#
# What Trellis hands to django-q2 is counted where it lands: the broker, on a list of this test's
# own that no worker process serves (``handed_out``). The test takes the tasks off that list and
# is the worker (``run_job``, ``claim_job`` and ``finish_job``: the worker's entry points).


@pytest.fixture
def handed_out(monkeypatch):
    """A broker list of this test only: every ``async_task`` of the test goes there (django-q2's
    ``Conf.CLUSTER_NAME`` names the list a task is pushed on; its signing salt is unchanged)."""
    import uuid

    from django_q.brokers import get_broker
    from django_q.conf import Conf

    name = f"{Conf.CLUSTER_NAME}-wake-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(Conf, "CLUSTER_NAME", name)
    broker = get_broker(name)
    yield broker
    broker.purge_queue()


def take_turns(broker, *, wait: bool = False) -> list[str]:
    """The job ids of the turn tasks on ``broker``'s list, taken off it in order (other tasks, a
    branch's naming, are dropped). ``wait``: block up to a second for the first one."""
    from django_q.signing import SignedPackage

    ids = []
    while wait or broker.queue_size():
        wait = False
        for task_id, payload in broker.dequeue() or []:
            broker.acknowledge(task_id)
            task = SignedPackage.loads(payload)
            if task["func"] == "collab.tasks.run_turn":
                ids.append(task["args"][0])
    return ids


def capped_sessions(team, n: int, cap: int) -> list:
    """``n`` sessions of a scripted agent in project alpha, whose running cap is ``cap``."""
    from collab.models import AgentSpec
    from collab.services.sessions import do_create_session

    Project.objects.filter(pk=team.alpha.pk).update(max_running_jobs=cap)
    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "ok {{prompt}}"}])
    return [do_create_session(team.member, team.alpha, title=f"s{i}", agent_id="echo") for i in range(n)]


def test_a_job_declined_for_the_cap_is_handed_out_again_once_when_a_slot_frees(
        team, handed_out, django_capture_on_commit_callbacks):
    """With a cap of 2 and two turns running, a third turn whose claim is
    declined is handed back to the queue once, by the first completion; the second completion
    hands out nothing — neither the declined turn again, nor a turn that was never declined
    (still queued with its own task on the way, though older than the declined one)."""
    from collab.services.execution import claim_job, finish_job
    from collab.services.turns import do_start_user_turn

    s1, s2, s3, s4 = capped_sessions(team, 4, cap=2)
    with django_capture_on_commit_callbacks(execute=True):
        a1, a2, never_declined, declined = (do_start_user_turn(team.member, s, "go") for s in (s1, s2, s3, s4))
    assert take_turns(handed_out) == [a1.pk, a2.pk, never_declined.pk, declined.pk]  # the admissions'

    with django_capture_on_commit_callbacks(execute=True):
        running = [claim_job(a1.pk), claim_job(a2.pk)]
        assert claim_job(declined.pk) is None  # at the cap
        assert claim_job(declined.pk) is None  # declined again (a second hand-off): still one mark
    assert Job.objects.get(pk=declined.pk).waiting_since is not None
    assert take_turns(handed_out) == []  # a decline hands nothing out

    with django_capture_on_commit_callbacks(execute=True):
        finish_job(running[0], status="succeeded", final_text="done", result_text="done")
    assert take_turns(handed_out) == [declined.pk]
    assert Job.objects.get(pk=declined.pk).waiting_since is None  # woken: the mark is cleared
    with django_capture_on_commit_callbacks(execute=True):
        finish_job(running[1], status="succeeded", final_text="done", result_text="done")
    assert take_turns(handed_out) == []

    from collab.runtime.loop import run_job

    with django_capture_on_commit_callbacks(execute=True):
        assert [run_job(never_declined.pk), run_job(declined.pk)] == ["succeeded", "succeeded"]
    assert take_turns(handed_out) == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks (SQLite runs one write transaction at a time)")
@pytest.mark.django_db(transaction=True)
def test_a_claim_declined_while_a_completion_commits_hands_the_job_out_itself(team, handed_out):
    """The race: a completion has ended a job of the project and looked for
    waiting jobs (none yet) but not committed; a claim counts that job as running and is declined.
    The completion cannot see the claim's mark, so the claim waits for it (it locks the jobs it
    counted), then sees the slot free and hands the job back to the queue itself, unmarked — the
    job is neither lost (until the reconciler) nor handed out twice."""
    import threading

    from collab.services.execution import claim_job, finish_job
    from collab.services.turns import do_start_user_turn

    s1, s2 = capped_sessions(team, 2, cap=1)
    running, declined = do_start_user_turn(team.member, s1, "go"), do_start_user_turn(team.member, s2, "go")
    assert take_turns(handed_out) == [running.pk, declined.pk]
    running = claim_job(running.pk)

    ended, commit = threading.Event(), threading.Event()

    def completion():
        try:
            with transaction.atomic():  # the completion's transaction, held open after its work
                finish_job(running, status="succeeded", final_text="done", result_text="done")
                ended.set()
                commit.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=completion)
    thread.start()
    assert ended.wait(30)

    def claim_waits_for_the_completion():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND query LIKE '%%FOR NO KEY UPDATE%%'")
            if cursor.fetchone()[0]:
                commit.set()

    watcher = threading.Thread(target=lambda: (poll(lambda: claim_waits_for_the_completion() or commit.is_set(),
                                                    timeout=10, what="the claim waiting"), connection.close()))
    watcher.start()
    assert claim_job(declined.pk) is None  # declined: the completion had not committed when it counted
    watcher.join(30)
    thread.join(30)
    assert take_turns(handed_out) == [declined.pk]  # handed out by the claim, once
    assert Job.objects.get(pk=declined.pk).waiting_since is None
    assert claim_job(declined.pk).status == "running"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks (SQLite runs one write transaction at a time)")
@pytest.mark.django_db(transaction=True)
def test_a_declined_claim_waits_for_a_running_job_holding_no_lock(team, handed_out):
    """A declined claim looks at the project's running jobs only after its
    own transaction has committed, one row at a time — while it waits for a running job's row (here
    held by another transaction, as a cancel's cascade holds it while it goes on to lock that
    job's session), it holds none of the locks it took to claim. Waiting for the job while holding
    the declined job's session would close a cycle with such a cascade (a deadlock)."""
    import threading

    from collab.models import Session
    from collab.services.execution import claim_job
    from collab.services.turns import do_start_user_turn

    s1, s2 = capped_sessions(team, 2, cap=1)
    running, declined = do_start_user_turn(team.member, s1, "go"), do_start_user_turn(team.member, s2, "go")
    assert take_turns(handed_out) == [running.pk, declined.pk]
    assert claim_job(running.pk).status == "running"

    held, release = threading.Event(), threading.Event()

    def holder():  # a transaction holding the running job's row
        try:
            with transaction.atomic():
                Job.objects.select_for_update(no_key=True).get(pk=running.pk)
                held.set()
                release.wait(30)
        finally:
            connection.close()

    claimed = []

    def claimer():
        try:
            claimed.append(claim_job(declined.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert held.wait(30)
    threads.append(threading.Thread(target=claimer))
    threads[1].start()
    try:
        def claim_waiting():
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock' AND query LIKE '%%FOR NO KEY UPDATE%%'")
                return cursor.fetchone()[0] > 0

        poll(claim_waiting, timeout=20, what="the declined claim waiting for the running job's row")
        # meanwhile the declined job's session is free: the claim's transaction has ended
        with transaction.atomic():
            assert Session.objects.select_for_update(nowait=True).filter(pk=s2.pk).exists()
        assert Job.objects.get(pk=declined.pk).waiting_since is not None  # its mark is committed
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert claimed == [None]
    assert take_turns(handed_out) == []  # the job still runs: no slot is free, the mark stays
    assert Job.objects.get(pk=declined.pk).waiting_since is not None


def test_a_woken_job_that_ends_before_it_starts_passes_its_slot_on(
        team, handed_out, django_capture_on_commit_callbacks):
    """A completion wakes the oldest job waiting for a slot; if that job is
    cancelled before a worker claims it, the slot it never took goes to the next job waiting —
    not to the reconciler, a lease later."""
    from collab.services.cancel import do_execution_command
    from collab.services.execution import claim_job, finish_job
    from collab.services.turns import do_start_user_turn

    s1, s2, s3 = capped_sessions(team, 3, cap=1)
    with django_capture_on_commit_callbacks(execute=True):
        r, first, second = (do_start_user_turn(team.member, s, "go") for s in (s1, s2, s3))
    take_turns(handed_out)
    with django_capture_on_commit_callbacks(execute=True):
        running = claim_job(r.pk)
        assert claim_job(first.pk) is None and claim_job(second.pk) is None  # both wait for the slot
    with django_capture_on_commit_callbacks(execute=True):
        finish_job(running, status="succeeded", final_text="done", result_text="done")
    assert take_turns(handed_out) == [first.pk]  # one slot: the oldest
    first.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        do_execution_command(team.member, first, command_id="cancel-first", action="execution.cancel",
                             expected_version=first.version, payload={})
    assert Job.objects.get(pk=first.pk).status == "cancelled"
    assert take_turns(handed_out) == [second.pk]
    assert Job.objects.get(pk=second.pk).waiting_since is None


def test_a_completion_wakes_by_the_cap_as_it_is_now(team, handed_out, django_capture_on_commit_callbacks):
    """The cap raised while a turn runs: its completion wakes as many waiting
    jobs as the new cap leaves slots for (it reads the project's cap again, not the one the claim saw)."""
    from collab.services.execution import claim_job, finish_job
    from collab.services.turns import do_start_user_turn

    sessions = capped_sessions(team, 4, cap=1)
    with django_capture_on_commit_callbacks(execute=True):
        r, *waiting = (do_start_user_turn(team.member, s, "go") for s in sessions)
    take_turns(handed_out)
    with django_capture_on_commit_callbacks(execute=True):
        running = claim_job(r.pk)
        assert [claim_job(j.pk) for j in waiting] == [None, None, None]
    Project.objects.filter(pk=team.alpha.pk).update(max_running_jobs=2)  # the operator raises it
    with django_capture_on_commit_callbacks(execute=True):
        finish_job(running, status="succeeded", final_text="done", result_text="done")
    assert take_turns(handed_out) == [j.pk for j in waiting[:2]]  # two slots free now: the two oldest


@pytest.mark.one_database("sqlite")  # the data migration's Python; every migration runs on both at set-up
@pytest.mark.django_db(transaction=True)
def test_the_migration_marks_queued_background_jobs_as_waiting(team, handed_out):
    """Before migration 0021 a completion handed out every queued background job of its project;
    after it, only marked ones. A job queued across the upgrade (declined before it, unmarked) is
    marked by the migration, so the next completion in its project wakes it."""
    from django.db.migrations.executor import MigrationExecutor

    from collab.services.turns import do_start_user_turn

    (s1,) = capped_sessions(team, 1, cap=1)
    job = do_start_user_turn(team.member, s1, "go")
    assert job.run_in_background and Job.objects.get(pk=job.pk).waiting_since is None
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("collab", "0020_job_partial_indexes")])
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        assert Job.objects.get(pk=job.pk).waiting_since is not None
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def run_as_workers(broker, job_ids, *, slots: int, timeout: float = 120) -> dict:
    """``slots`` threads, each a worker slot: take one task off the list, run it as the worker
    does (``run_job``), again, until every job of ``job_ids`` has ended (failing after
    ``timeout`` s: a job was lost). Returns what the tasks found: ``tasks`` handed out and taken,
    ``declined`` (the claim was declined: ``run_job`` returned None), ``stale`` (the task's job was
    no longer queued when it was taken: a task that could only be wasted)."""
    import threading
    import time

    from django_q.signing import SignedPackage

    from collab.models import TERMINAL_STATUSES
    from collab.runtime.loop import run_job

    counts, errors, lock = {"tasks": 0, "declined": 0, "stale": 0}, [], threading.Lock()
    deadline = time.monotonic() + timeout

    def slot():
        try:
            while time.monotonic() < deadline:
                taken = [SignedPackage.loads(payload) for task_id, payload in broker.dequeue() or []
                         if broker.acknowledge(task_id) or True]
                turns = [task["args"][0] for task in taken if task["func"] == "collab.tasks.run_turn"]
                if not taken and not Job.objects.filter(pk__in=job_ids).exclude(status__in=TERMINAL_STATUSES).exists():
                    return
                for job_id in turns:
                    stale = Job.objects.filter(pk=job_id).values_list("status", flat=True).get() != "queued"
                    declined = run_job(job_id) is None
                    with lock:
                        counts["tasks"] += 1
                        counts["declined"] += declined
                        counts["stale"] += stale
        except Exception as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=slot) for _ in range(slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 30)
    assert not errors, errors
    open_jobs = list(Job.objects.filter(pk__in=job_ids).exclude(status__in=TERMINAL_STATUSES).values_list("pk", "status"))
    assert not open_jobs, f"lost (never ended, no reconciler here): {open_jobs}, {counts}"
    return counts


@pytest.mark.django_db(transaction=True)
def test_a_burst_in_one_project_hands_out_one_task_per_turn(team, handed_out):
    """Forty turns submitted at once in one project with a cap of 2, drained by
    two worker slots (``bench/turns.py``'s concurrent run): no claim is declined, so each turn is
    handed to the queue once, by its admission — a completion no longer hands out the project's
    oldest queued turns, whose own tasks are on the way (1.99 tasks a turn before)."""
    from collab.services.turns import do_start_user_turn

    jobs = [do_start_user_turn(team.member, s, "go").pk for s in capped_sessions(team, 40, cap=2)]
    counts = run_as_workers(handed_out, jobs, slots=2)
    assert counts == {"tasks": 40, "declined": 0, "stale": 0}, counts
    assert set(Job.objects.filter(pk__in=jobs).values_list("status", flat=True)) == {"succeeded"}


@pytest.mark.django_db(transaction=True)
def test_nothing_is_lost_and_nothing_handed_out_twice_when_slots_are_contended(team, handed_out):
    """A race loop: more worker slots than the cap (4 slots, caps 1 and 2), so
    claims are declined while completions free slots, over many rounds of a burst of turns in one
    project. With no reconciler, every turn ends; every task beyond a turn's first met a claim
    declined for the cap and none found its job gone (``stale``): at most N + declines tasks,
    each one needed."""
    from collab.services.turns import do_start_user_turn

    sessions = capped_sessions(team, 8, cap=1)
    declined = 0
    for rounds, cap in enumerate([1, 2] * 8):
        Project.objects.filter(pk=team.alpha.pk).update(max_running_jobs=cap)
        jobs = [do_start_user_turn(team.member, s, f"round {rounds}").pk for s in sessions]
        counts = run_as_workers(handed_out, jobs, slots=4)
        assert counts["stale"] == 0 and counts["tasks"] == len(jobs) + counts["declined"], (rounds, counts)
        declined += counts["declined"]
        assert set(Job.objects.filter(pk__in=jobs).values_list("status", flat=True)) == {"succeeded"}
    print(f"declined claims over the rounds: {declined}")


# in the wake-up's statement: a scan of collab_job other than the per-candidate check (alias U0),
# whose access path is the planner's call on the table's size (at most one probe per candidate),
# or a join
WHOLE_JOB_SCAN = re.compile(r"Seq Scan on collab_job(?! u0)|Join|Nested Loop Anti|Nested Loop Semi")
ANY_JOIN = re.compile(r"Join|Nested Loop")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")
def test_the_wake_ups_plan_does_not_depend_on_the_tables_statistics(team):
    """With 400 turns queued in the project and three of them declined for the
    cap, the wake-up finds its candidates through the partial index ``job_waiting_for_slot`` and
    checks each one's branch in a SubPlan — never a join over the project's queued jobs (the NOT
    EXISTS it replaced was planned, without statistics, as a nested loop scanning every queued job
    per queued job) — both as the table is found (a fresh database has no statistics) and after
    ANALYZE. The completion's probe (``slot_waiters``) is one EXISTS, run once, joined to nothing."""
    from django.db.models.functions import Now
    from django.test.utils import CaptureQueriesContext

    from collab.models import Branch
    from collab.services.fair_share import running_cap, slot_waiters, wake_waiting_in_project

    sessions = capped_sessions(team, 40, cap=2)
    branch_of = dict(Branch.objects.filter(session__in=sessions).values_list("session_id", "pk"))
    jobs = Job.objects.bulk_create([Job(project=team.alpha, session=s, branch_id=branch_of[s.pk], kind="user",
                                        status="queued", prompt="p") for _ in range(10) for s in sessions])
    declined = [job.pk for job in jobs[:40:13]]  # each the oldest on its branch
    Job.objects.filter(pk__in=declined).update(waiting_since=Now())
    project, ended_branch = Project.objects.get(pk=team.alpha.pk), jobs[1].branch_id
    # one of the oldest declined (rows written in one transaction share their time: any of them)
    first = Job.objects.filter(pk__in=declined).order_by("created_at").values_list("created_at", flat=True)[0]
    oldest = set(Job.objects.filter(pk__in=declined, created_at=first).values_list("pk", flat=True))

    def plans() -> tuple[str, str]:
        with CaptureQueriesContext(connection) as statements, transaction.atomic():
            woken = wake_waiting_in_project(project.pk, cap=running_cap(project), ended_branch_id=ended_branch, running=1)
            assert len(woken) == 1 and woken[0] in oldest, (woken, oldest)
            transaction.set_rollback(True)  # woken in a rolled-back transaction: planned again below
        wake = [q["sql"] for q in statements.captured_queries if q["sql"].startswith("UPDATE")]
        assert len(wake) == 1, statements.captured_queries  # picks and unmarks in one statement
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + wake[0])
            wake_plan = "\n".join(row[0] for row in cursor.fetchall())
        probe = Branch.objects.filter(pk=ended_branch).annotate(
            waiting=slot_waiters(project.pk, except_branch_id=ended_branch)).values("waiting")
        return wake_plan, probe.explain()

    for state in ("as found", "analyzed"):
        if state == "analyzed":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE collab_job")
        wake, probe = plans()
        assert "job_waiting_for_slot" in wake and "SubPlan" in wake and not WHOLE_JOB_SCAN.search(wake), (state, wake)
        assert not ANY_JOIN.search(probe), (state, probe)
