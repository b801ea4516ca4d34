"""Statements compiled once per process and shape (collab.infra.prepared; the
CPU of a turn): a cached statement runs the same SQL with new values bound each time,
reads rows as the ORM reads them, and is compiled once per process, whatever the connection —
on SQLite and PostgreSQL alike (the suite runs on both)."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import DurationField, Exists, F, OuterRef
from django.db.models.functions import Now
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from collab.models import Branch, Job, JobStatus, Message, Session
from collab.infra.prepared import Param, Select, Update


@pytest.fixture
def two_jobs(team, monkeypatch):
    """Two queued turns, in two sessions of project alpha (nothing hands them to a worker)."""
    from collab.models import AgentSpec
    from collab import brokers
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    monkeypatch.setattr(brokers, "async_task", lambda *args, **kwargs: None)
    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "ok"}])
    return [do_start_user_turn(team.member, do_create_session(team.member, team.alpha, title=f"s{n}", agent_id="echo"),
                               f"prompt {n}") for n in range(2)]


class Counting:
    """A builder that counts how often it was asked for its queryset (a compilation each)."""

    def __init__(self, build):
        self.build, self.calls = build, []

    def __call__(self, *shape):
        self.calls.append(shape)
        return self.build(*shape)


def test_a_cached_select_binds_new_values_each_time(two_jobs):
    build = Counting(lambda: Job.objects.filter(pk=Param("job")).values_list("pk", "status"))
    statement = Select("test.job_status", build)
    for job in (*two_jobs, *two_jobs):
        assert statement.rows(job=job.pk) == [(job.pk, JobStatus.QUEUED)]
    assert statement.first(job="no-such-job") is None
    assert build.calls == [()]  # compiled once, on this connection


def test_the_cache_is_per_shape(two_jobs):
    """Each shape is a statement of its own; a shape seen before is not compiled again."""

    def build(flat):
        rows = Job.objects.filter(pk=Param("job"))
        return rows.values_list("status", flat=True) if flat else rows.values_list("pk", "status")

    counting = Counting(build)
    statement = Select("test.shapes", counting)
    job = two_jobs[0]
    assert statement.rows(True, job=job.pk) == [JobStatus.QUEUED]
    assert statement.rows(False, job=job.pk) == [(job.pk, JobStatus.QUEUED)]
    assert statement.rows(True, job=two_jobs[1].pk) == [JobStatus.QUEUED]
    assert counting.calls == [(True,), (False,)]


def test_a_statement_compiled_once_runs_on_another_threads_connection(transactional_db, two_jobs):
    """The cache is the process's: another thread, with a connection of its own, runs the statement
    compiled here without compiling it again, and reads its own rows through it."""
    import threading

    build = Counting(lambda: Job.objects.filter(pk=Param("job")).values_list("status", flat=True))
    statement = Select("test.threads", build)
    assert statement.first(job=two_jobs[0].pk) == JobStatus.QUEUED
    read_elsewhere = []

    def elsewhere():
        from django.db import connections

        try:
            read_elsewhere.append(statement.first(job=two_jobs[1].pk))
        finally:
            connections.close_all()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert read_elsewhere == [JobStatus.QUEUED]
    assert len(build.calls) == 1


def test_a_cached_select_reads_instances_as_the_orm_does(two_jobs):
    """Model rows with their ``select_related`` rows (no query to reach them) and annotations,
    each column converted by its field (datetimes, JSON, booleans)."""
    statement = Select("test.first_look", lambda: Job.objects.select_related(
        "branch", "session", "prompt_msg", "agent_spec").filter(pk=Param("job")))
    for job in two_jobs:
        expected = Job.objects.select_related("branch", "session", "prompt_msg", "agent_spec").get(pk=job.pk)
        got = statement.get(job=job.pk)
        with CaptureQueriesContext(connection) as reads:
            assert (got.branch, got.session, got.prompt_msg, got.agent_spec) == (
                expected.branch, expected.session, expected.prompt_msg, expected.agent_spec)
            assert got.created_at == expected.created_at and got.created_at.tzinfo is not None
            assert got.prompt_msg.metadata == expected.prompt_msg.metadata
            assert got.branch.archived is False and got.session.title == expected.session.title
        assert len(reads) == 0
        assert {f.attname: getattr(got, f.attname) for f in Job._meta.concrete_fields} == {
            f.attname: getattr(expected, f.attname) for f in Job._meta.concrete_fields}
    with pytest.raises(Job.DoesNotExist):
        statement.get(job="no-such-job")


def test_a_locking_select_is_refused_outside_a_transaction_every_time(transactional_db, two_jobs):
    statement = Select("test.lock", lambda: Session.objects.select_for_update(no_key=True).filter(pk=Param("id")))
    sid = two_jobs[0].session_id
    with transaction.atomic():
        assert statement.get(id=sid).pk == sid
    if not connection.features.has_select_for_update:  # SQLite: no row locks, and no refusal (as the ORM)
        assert statement.get(id=sid).pk == sid
        return
    with pytest.raises(TransactionManagementError):
        statement.get(id=sid)  # compiled already: still refused


def _claim():
    rows = Job.objects.filter(pk=Param("job"), status=JobStatus.QUEUED)
    sets = {"status": JobStatus.RUNNING, "version": F("version") + 1, "worker": Param("worker"),
            "lease_expires_at": Now() + Param("lease", DurationField()), "started_at": Now()}
    returning = {"has_prompt": Exists(Message.objects.filter(pk=OuterRef("prompt_msg_id")))}
    return rows, sets, returning


def test_a_cached_update_sets_and_returns_new_values_each_time(two_jobs):
    """A conditional UPDATE … RETURNING: each run sets its own values (a Param set as a column is
    prepared as that column's field — a duration added to the database clock too), returns the
    row as it left it, and nothing when the condition no longer holds."""
    build = Counting(_claim)
    claim = Update("test.claim", build)
    for n, job in enumerate(two_jobs):
        (won,) = claim.run(job=job.pk, worker=f"host:{n}", lease=timedelta(seconds=60 * (n + 1)))
        row = Job.objects.get(pk=job.pk)
        assert (won.pk, won.status, won.worker, won.version) == (job.pk, JobStatus.RUNNING, f"host:{n}", job.version + 1)
        assert won.has_prompt and won.lease_expires_at == row.lease_expires_at and won.started_at == row.started_at
        assert timedelta(seconds=60 * (n + 1) - 5) < row.lease_expires_at - row.started_at <= timedelta(seconds=60 * (n + 1))
        assert claim.run(job=job.pk, worker="late", lease=timedelta(seconds=1)) == []  # not queued any more
        assert Job.objects.get(pk=job.pk).worker == f"host:{n}"
    assert build.calls == [()]


def test_an_update_without_returning_goes_through_the_orm_with_the_same_values(two_jobs, monkeypatch):
    """A database without UPDATE … RETURNING (SQLite before 3.35): the same builder, its Params
    bound to the values, run as ``update_returning`` runs it there — the rows first, then the UPDATE."""
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    claim = Update("test.claim.no_returning", _claim)
    job = two_jobs[0]
    (won,) = claim.run(job=job.pk, worker="host:orm", lease=timedelta(seconds=30))
    assert (won.status, won.worker, won.has_prompt) == (JobStatus.RUNNING, "host:orm", True)
    assert Job.objects.get(pk=job.pk).worker == "host:orm"
    assert claim.run(job=job.pk, worker="again", lease=timedelta(seconds=30)) == []


def test_a_statement_without_a_value_for_its_param_is_refused(two_jobs):
    statement = Select("test.missing", lambda: Branch.objects.filter(pk=Param("id")).values_list("pk", flat=True))
    with pytest.raises(TypeError, match="'id'"):
        statement.rows(branch=two_jobs[0].branch_id)


def test_the_cache_survives_a_reconnect(transactional_db, two_jobs):
    """A statement does not belong to a connection: after a reconnect (as a pool, or a request's
    own connection under ASGI, hands out another) it runs again, binding as before, uncompiled."""
    build = Counting(lambda: Job.objects.filter(pk=Param("job")).values_list("status", flat=True))
    statement = Select("test.reconnect", build)
    assert statement.first(job=two_jobs[0].pk) == JobStatus.QUEUED
    connection.close()
    assert statement.first(job=two_jobs[1].pk) == JobStatus.QUEUED
    assert statement.first(job=two_jobs[0].pk) == JobStatus.QUEUED
    assert len(build.calls) == 1


def test_a_builder_that_freezes_a_time_is_refused(two_jobs):
    """A time read when the statement is built would be bound to every later run (an expiry that
    never passes): refused, so it is passed as a Param or read from the database's clock. The
    builders are the same on both databases; PostgreSQL's run sees the time as a time (SQLite's
    lookups turn it into text before the check)."""
    from django.utils import timezone

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's lookups hand the driver times as text")
    statement = Select("test.frozen", lambda: Job.objects.filter(pk=Param("job"), created_at__lt=timezone.now()))
    with pytest.raises(TypeError, match="Param"):
        statement.first(job=two_jobs[0].pk)


def test_a_claimed_and_finished_turn_is_what_it_was_on_this_database(two_jobs, django_capture_on_commit_callbacks):
    """The worker's own statements (claim, completion) through the cache, twice on one connection:
    the second turn binds its own job, worker and results."""
    from collab.runtime.loop import run_job

    for job in two_jobs:
        assert run_job(job.pk) == JobStatus.SUCCEEDED
        ended = Job.objects.with_result().get(pk=job.pk)
        assert ended.final_answer == "ok" and ended.worker and ended.lease_expires_at is None
        assert ended.started_at <= ended.finished_at and ended.version == job.version + 2
    assert connection.vendor in ("postgresql", "sqlite")


def test_a_cached_insert_writes_the_row_create_would(two_jobs):
    """A one-row INSERT compiled once: each call writes its own row (its id from the model's
    default at each call, not frozen), with the values ``create`` would write, and reads back the
    column the database fills (``created_at``, ``db_default``) — the instance is as the row."""
    from collab.infra.prepared import Insert

    source = two_jobs[0]
    fields = dict(project_id=source.project_id, session_id=source.session_id, branch_id=source.branch_id,
                  kind=source.kind, status=JobStatus.QUEUED, prompt="again", started_by_id=source.started_by_id,
                  agent_spec_id=source.agent_spec_id)
    insert = Insert("test.new_job", Job)
    made = [insert.create(**fields, prompt_header=f"h{n}") for n in range(2)]
    assert made[0].pk != made[1].pk
    for n, job in enumerate(made):
        row = Job.objects.get(pk=job.pk)
        assert job._state.adding is False and job.created_at is not None and job.prompt_header == f"h{n}"
        assert {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields} == {
            f.attname: getattr(row, f.attname) for f in Job._meta.concrete_fields}
    given = insert.create(**fields, created_at=made[0].created_at)  # a db_default column given: as create does
    assert Job.objects.get(pk=given.pk).created_at == made[0].created_at


def test_a_statements_constants_are_in_its_sql_on_postgresql(two_jobs):
    """PostgreSQL plans a prepared statement once for all values: a constant sent as a parameter
    proves nothing about a partial index's predicate (``status IN ('queued', …)``) or a status's
    frequency. On PostgreSQL the constants a builder puts in a statement are written into its SQL
    as quoted literals, only the Params left as parameters; rows read and written are the same."""
    from collab.infra.prepared import _STATEMENTS, _Slot

    odd = "it's 50%"  # a quote and a percent sign, as SQL and the driver's placeholders see them
    statement = Select("test.constants", lambda: Job.objects.filter(
        pk=Param("job"), status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exclude(prompt_header=odd)
        .values_list("pk", flat=True))
    claim = Update("test.claim.constants", _claim)
    assert statement.rows(job=two_jobs[0].pk) == [two_jobs[0].pk]
    (won,) = claim.run(job=two_jobs[1].pk, worker="w", lease=timedelta(seconds=30))
    assert won.status == JobStatus.RUNNING and won.version == two_jobs[1].version + 1
    Job.objects.filter(pk=two_jobs[0].pk).update(prompt_header=odd)
    assert statement.rows(job=two_jobs[0].pk) == []  # the quoted constant matches the stored text
    select = _STATEMENTS[(connection.alias, connection.vendor, "test.constants")]
    update = _STATEMENTS[(connection.alias, connection.vendor, "test.claim.constants")]
    if connection.vendor != "postgresql":  # SQLite plans each statement anew: parameters as the ORM sends them
        assert JobStatus.QUEUED in select.params
        return
    assert all(type(p) is _Slot for p in (*select.params, *update.params))
    assert [p.name for p in select.params] == ["job"] and {p.name for p in update.params} == {"job", "worker", "lease"}
    assert "IN ('queued', 'running')" in select.sql and "'it''s 50%%'" in select.sql
    assert "\"status\" = 'running'" in update.sql and "\"status\" = 'queued'" in update.sql
    assert '"version" + 1' in update.sql


def test_a_hidden_constant_stays_a_parameter_with_its_value(two_jobs):
    """``Param.hidden``: a constant bound at every run, never written into the SQL, so the
    planner cannot prove a partial index from it — the claim's ``id = … AND status = 'queued'``
    reads the job by its key, not every queued job (a generic plan made while the queue was short
    scanned ``job_status_lease`` for the id). The caller passes no value for it; it matches as the
    constant would, on both databases."""
    from collab.infra.prepared import _STATEMENTS, _Slot

    statement = Select("test.hidden", lambda: Job.objects.filter(
        pk=Param("job"), status=Param.hidden("queued", JobStatus.QUEUED)).values_list("pk", flat=True))
    assert statement.rows(job=two_jobs[0].pk) == [two_jobs[0].pk]
    Job.objects.filter(pk=two_jobs[0].pk).update(status=JobStatus.CANCELLED, finished_at=Now())
    assert statement.rows(job=two_jobs[0].pk) == []
    compiled = _STATEMENTS[(connection.alias, connection.vendor, "test.hidden")]
    hidden = [p for p in compiled.params if type(p) is _Slot and p.name == "queued"]
    assert hidden and hidden[0].fixed == JobStatus.QUEUED
    assert "'queued'" not in compiled.sql
    # the service's claim: the job's own guard hidden, the subqueries' statuses in the SQL
    from collab.services.execution import _claim as service_claim

    (won,) = Update("test.service.claim", service_claim).run(False, job=two_jobs[1].pk, worker="w",
                                                             lease=timedelta(seconds=30))
    assert won.status == JobStatus.RUNNING
    claim = _STATEMENTS[(connection.alias, connection.vendor, "test.service.claim", False)]
    assert [p.fixed for p in claim.params if type(p) is _Slot and p.name == "queued"] == [JobStatus.QUEUED]
