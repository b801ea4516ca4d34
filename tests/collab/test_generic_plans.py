"""The hot statements' generic plans read what they are about, however long the queue (the "Turn
overhead" target of docs/performance.md#targets, which must hold at volume). PostgreSQL plans a
prepared statement once for all values, on the statistics of the moment; a job queue's statistics
are taken when the queue is short (a quiet moment, a fresh database) and the plan is kept while it
is long. With the queue's status in the SQL, such a plan read every queued job to find one: the
claim scanned ``job_status_lease`` for its job's id, the admission's "is the branch occupied?" and
the completion's "what is queued next here?" scanned it for the branch (``bench/turns.py`` under
``auto_explain``: ~65–80 index entries read per turn at a 600-turn backlog, more as it grows).

Each statement is compiled as the service compiles it, then run here as PostgreSQL runs it
from its plan cache (``PREPARE`` … ``EXECUTE`` with ``plan_cache_mode = force_generic_plan``),
with the statistics of a fresh database (none yet) and with those of a queue on one branch."""

import itertools
import json
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql as psycopg_sql

from collab.models import Job, JobStatus
from collab.models.ids import new_id
from collab.infra.prepared import _PLACEHOLDER, _STATEMENTS, Select, Update, _bind

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache")

BACKLOG = 150
_PG_TYPES = ((bool, "boolean"), (str, "text"), (int, "bigint"), (timedelta, "interval"))


@pytest.fixture(params=["never analyzed", "analyzed with the backlog"])
def backlog(request, team, monkeypatch):
    """Three sessions of project alpha: two with a queued turn each, one idle; 400 ended jobs
    and ``BACKLOG`` queued ones on the second session's branch; statistics as a fresh database
    has them (none), or taken with the backlog there (a queue on one branch)."""
    from collab.models import AgentSpec
    from collab import brokers
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    monkeypatch.setattr(brokers, "async_task", lambda *args, **kwargs: None)
    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "ok"}])
    sessions = [do_create_session(team.member, team.alpha, title=f"s{n}", agent_id="echo") for n in range(3)]
    mine, other = (do_start_user_turn(team.member, session, "prompt") for session in sessions[:2])
    row = Job.objects.filter(pk=other.pk).values().get()
    now = timezone.now()

    def copies(n, **fields):
        return [Job(**{**row, "id": new_id(), **fields}) for _ in range(n)]

    Job.objects.bulk_create(copies(400, status=JobStatus.SUCCEEDED, started_at=now, finished_at=now))
    Job.objects.bulk_create(copies(BACKLOG, status=JobStatus.QUEUED))
    if request.param == "analyzed with the backlog":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE collab_job")
    return mine, other, sessions[2].branches.get()


def _generic_plan(name: str, shape: tuple, values: dict) -> dict:
    """The plan PostgreSQL's plan cache keeps for the compiled statement ``name`` (its generic
    plan), run once with ``values`` (EXPLAIN ANALYZE; rolled back)."""
    compiled = _STATEMENTS[(connection.alias, connection.vendor, name, *shape)]
    params = _bind(compiled.params, values, connection)
    numbers = itertools.count(1)  # the driver's placeholders as SQL's PREPARE numbers them
    sql = _PLACEHOLDER.sub(lambda m: "%" if m.group() == "%%" else f"${next(numbers)}", compiled.sql)
    types = ", ".join(next(pg_type for kind, pg_type in _PG_TYPES if isinstance(p, kind)) for p in params)
    args = ", ".join(psycopg_sql.Literal(p).as_string(connection.connection) for p in params)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # SQL's PREPARE and EXECUTE, on the simple protocol (a statement with parameters of its own
        # is prepared in SQL only there; EXPLAIN takes no bound parameters); rolled back after
        raw = connection.connection.pgconn
        try:
            prepared = raw.exec_(f"PREPARE trellis_generic ({types}) AS {sql}".encode())
            assert prepared.error_message == b"", prepared.error_message
            explained = raw.exec_(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE trellis_generic ({args})".encode())
            assert explained.error_message == b"", explained.error_message
            plan = json.loads(explained.get_value(0, 0))
        finally:
            raw.exec_(b"DEALLOCATE trellis_generic")
        transaction.set_rollback(True)
    return plan[0]["Plan"]


def _read_and_dropped(plan: dict) -> int:
    """Rows the plan's nodes read and then dropped (a filter's), every loop of every node."""
    dropped = (plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Index Recheck", 0)) \
        * plan.get("Actual Loops", 1)
    return dropped + sum(_read_and_dropped(child) for child in plan.get("Plans", []))


def test_the_claims_generic_plan_reads_its_job_by_key_not_the_queue(backlog):
    """The claim's guard on its own row (``status = 'queued'``) is a hidden parameter
    (``Param.hidden``): no partial index of queued jobs can be chosen to find one id."""
    from collab.services.execution import _claim

    mine, _, _ = backlog
    Update("test.generic.claim", _claim).run(False, job=new_id(), worker="w", lease=timedelta(seconds=30))
    plan = _generic_plan("test.generic.claim", (False,),
                         {"job": mine.pk, "worker": "w", "lease": timedelta(seconds=30)})
    assert _read_and_dropped(plan) < 5, plan


def test_is_occupied_reads_the_branchs_open_jobs_only(backlog):
    """Every admission asks whether the branch has an open job: ``job_open_on_branch`` holds the
    open jobs by branch, so the answer reads this branch's, not the queue's."""
    from collab.models.jobs import _ANY_ON_BRANCH, is_occupied

    mine, other, idle = backlog
    assert is_occupied(mine.branch) and is_occupied(other.branch) and not is_occupied(idle)
    assert _ANY_ON_BRANCH.name == "any_job_on_branch"
    for branch in (mine.branch, idle):  # an admission on an idle branch: nothing to find, nothing to read
        plan = _generic_plan("any_job_on_branch", ("open",), {"branch": branch.pk})
        assert _read_and_dropped(plan) < 5, plan


def test_the_completions_next_queued_job_is_read_on_its_branch(backlog):
    """The completion's probe of what waits (``_waiting``) reads the branch's next queued job from
    the branch's index (the status hidden), not from every queued job."""
    from collab.services.execution import _waiting

    mine, _, _ = backlog
    Select("test.generic.waiting", _waiting).first(True, branch=mine.branch_id, project=mine.project_id)
    plan = _generic_plan("test.generic.waiting", (True,), {"branch": mine.branch_id, "project": mine.project_id})
    assert _read_and_dropped(plan) < 5, plan
