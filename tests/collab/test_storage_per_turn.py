"""Storage per turn (the "History" target of docs/performance.md#targets: storage grows linearly, ≈
the text plus a small constant per message). ``bench/storage.py`` measures the bytes; these tests
pin what was cut so the bytes cannot creep back: a ``message.created`` event stores a reference to
its message, not a second copy of the text, while every reader still gets the whole payload; and
indexes no query needs do not exist (migration 0018); a turn's prompt and answer are stored once
(0019); the job's columns that are NULL for most turns are indexed only where set (0020), and a
node's metadata keeps no copy of its job."""

import pytest
from django.db import DatabaseError, connection, transaction

from collab.events import message_event, send_event_on_commit, with_full_payloads
from collab.models import TERMINAL_STATUSES, Event, Job, Message
from collab.selectors.events import events_after
from tests.conftest import poll

PER_TURN_TABLES = ("collab_event", "collab_message", "collab_job", "collab_branch", "collab_session")


def message_created(api, sid) -> list[dict]:
    return [e["payload"] for e in api.get(f"/api/sessions/{sid}/events", after=0).json()["events"]
            if e["type"] == "message.created"]


def test_a_message_created_event_stores_the_message_id_alone(team, scripted_session, run_queued):
    """Neither its text nor its job: the (immutable) message row holds both."""
    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).status_code == 202
    run_queued()

    messages = list(Message.objects.filter(session_id=sid).order_by("depth"))
    stored = Event.objects.filter(session_id=sid, type="message.created").order_by("seq")
    assert [e.payload for e in stored] == [{"id": m.id} for m in messages]
    assert [p["job"] for p in message_created(api, sid)] == [m.job_id for m in messages] != [None, None]


def test_an_executions_events_are_its_state_changes_and_the_messages_it_wrote(team, scripted_session, run_queued):
    """``events_after(job=…)`` (an execution's event stream) finds a ``message.created`` through
    the job of the message its log row names; a row written before, naming the job as well, is
    found as before — and no event of another execution comes with them."""
    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    jobs = [api.post(f"/api/sessions/{sid}/turns", {"prompt": p}).json()["execution_id"] for p in ("one", "two")]
    run_queued()
    answer = Message.objects.get(job_id=jobs[0], role="assistant")
    with transaction.atomic():  # as logged before the log stopped naming the job
        send_event_on_commit(sid, "message.created", message_event(answer), stored={"id": answer.id, "job": jobs[0]})

    everything = events_after(sid, 0, viewer=team.member)
    for jid in jobs:
        mine = events_after(sid, 0, viewer=team.member, job=jid)
        assert mine == [w for w in everything if w["payload"].get("job") == jid]
        assert sorted(w["type"] for w in mine if w["seq"] <= everything[-2]["seq"]) == [
            "job.queued", "job.running", "job.succeeded", "message.created", "message.created"]
    assert len(events_after(sid, 0, viewer=team.member, job=jobs[0])) == 6  # the older row too


def test_a_job_event_stores_what_cannot_be_derived_from_its_type_and_job(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).json()["execution_id"]
    run_queued()

    stored = Event.objects.filter(session_id=sid, type__startswith="job.").order_by("seq")
    assert [(e.type, e.payload) for e in stored] == [
        ("job.queued", {"job": jid, "version": 1}),
        ("job.running", {"job": jid, "version": 2}),
        ("job.succeeded", {"job": jid, "version": 3}),
    ]
    job = Job.objects.get(pk=jid)
    read = [e["payload"] for e in api.get(f"/api/sessions/{sid}/events", after=0).json()["events"]
            if e["type"].startswith("job.")]
    assert read == [{"job": jid, "status": status, "version": version, "kind": "user", "branch": job.branch_id,
                     "is_error": False, "error_code": ""}
                    for status, version in (("queued", 1), ("running", 2), ("succeeded", 3))]


def test_readers_of_the_log_get_the_payload_live_listeners_got(team, scripted_session, run_queued, monkeypatch):
    pushed = []
    monkeypatch.setattr("collab.events.push_events", lambda session_id, wires: pushed.extend(wires))
    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).status_code == 202
    run_queued()

    answer = Message.objects.get(session_id=sid, role="assistant")
    expected = {
        "id": answer.id, "address": f"{sid}:{answer.id}", "branch": answer.branch_id,
        "predecessor": answer.predecessor_id, "role": "assistant", "kind": "normal", "job": answer.job_id,
        "tool_calls": None, "text": "echo: hello",
    }
    [live] = [w["payload"] for w in pushed if w["type"] == "message.created"]
    assert live == expected
    assert message_created(api, sid)[-1] == expected
    # every event the worker pushed (claim, answer, completion) reads back from the log the same
    logged = {e["seq"]: e for e in api.get(f"/api/sessions/{sid}/events", after=0).json()["events"]}
    assert [w["type"] for w in pushed] == ["job.running", "message.created", "job.succeeded"]
    assert [logged[w["seq"]] for w in pushed] == pushed
    [row] = with_full_payloads(Event.objects.filter(session_id=sid, type="message.created", seq__gt=2))
    assert row.payload == expected


def test_a_long_text_comes_back_clipped_as_it_was_sent(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    prompt = "a" * 3000 + "b" * 3000
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).status_code == 202
    run_queued()

    first = message_created(api, sid)[0]
    assert first["text_truncated"] is True and first["text_length"] == len(prompt)
    assert first["text"] == message_event(Message.objects.get(session_id=sid, role="user"))["text"]
    assert first["text"].startswith("aaa") and first["text"].endswith("bbb") and len(first["text"]) < len(prompt)


def test_rows_that_hold_the_whole_payload_are_read_as_they_are(team, scripted_session, run_queued):
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).status_code == 202
    run_queued()
    message = Message.objects.get(session_id=sid, role="assistant")
    old = {**message_event(message), "text": "as logged before the payloads were cut"}
    with transaction.atomic():
        seq = send_event_on_commit(sid, "message.created", old).seq

    [wire] = events_after(sid, seq - 1, viewer=team.member)
    assert wire["payload"] == old


def test_a_page_of_events_reads_its_messages_and_jobs_in_one_query_each(team, scripted_session, run_queued,
                                                                         django_assert_num_queries):
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    for prompt in ("one", "two", "three"):
        assert api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).status_code == 202
    run_queued()
    def log():
        return list(Event.objects.filter(session_id=sid))  # read afresh: the payloads are rebuilt in place
    assert sum(e.type == "message.created" for e in log()) == 6

    events, no_messages, neither = log(), [e for e in log() if e.type != "message.created"], log()[:1]
    assert neither[0].type == "session.created"
    with django_assert_num_queries(2):
        with_full_payloads(events)
    with django_assert_num_queries(1):
        with_full_payloads(no_messages)
    with django_assert_num_queries(0):
        with_full_payloads(neither)
    with django_assert_num_queries(0):
        with_full_payloads(events)  # rebuilt already


def indexes(table: str, unique: bool = True) -> dict:
    """{index name: [columns]} of ``table`` (unique ones too unless ``unique`` is False), read from
    the catalog (Django's SQLite introspection cannot parse these tables' CHECKs)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT i.relname, x.indisunique, array_agg(a.attname ORDER BY k.n) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid JOIN unnest(x.indkey) WITH ORDINALITY k(attnum, n) ON true "
                "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum "
                "WHERE x.indrelid = %s::regclass GROUP BY i.relname, x.indisunique", [table])
            rows = cursor.fetchall()
        else:
            rows = []
            for _, name, is_unique, *_ in cursor.execute(f"PRAGMA index_list({table})").fetchall():
                columns = [r[2] for r in cursor.execute(f"PRAGMA index_info({name})").fetchall()]
                rows.append((name, bool(is_unique), columns))
    return {name: list(columns) for name, is_unique, columns in rows if unique or not is_unique}


def test_indexes_no_query_needs_do_not_exist(db):
    assert "event_type_created" not in indexes("collab_event")  # no query filters events on type alone
    assert "message_session_created" not in indexes("collab_message")  # message_session_keyset, backwards
    # a foreign key that leads a composite index keeps no index of its own (a partial one, on a
    # few of its rows — a branch's open jobs: job_open_on_branch — is not that index)
    for table, column in [("collab_event", "session_id"), ("collab_event", "project_id"),
                          ("collab_message", "session_id"), ("collab_message", "branch_id"),
                          ("collab_job", "session_id"), ("collab_job", "branch_id"), ("collab_job", "caller_branch_id"),
                          ("collab_branch", "session_id"), ("collab_session", "project_id"),
                          ("collab_branch", "tip_id")]:  # the tip moves on every message: HOT updates
        whole = {name: columns for name, columns in indexes(table, unique=False).items()
                 if name not in partial_indexes(table)}
        assert [column] not in whole.values(), (table, column)


def partial_indexes(table: str) -> set:
    """Names of ``table``'s partial indexes (``WHERE …``), read from the catalog."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                           "WHERE x.indrelid = %s::regclass AND x.indpred IS NOT NULL", [table])
            return {name for (name,) in cursor.fetchall()}
        return {row[1] for row in cursor.execute(f"PRAGMA index_list({table})").fetchall() if row[4]}


# a job's columns that are NULL for a person's turn (no caller, parent job, follow-up source or
# result artifact)
JOB_COLUMNS_MOSTLY_NULL = ("caller_session_id", "caller_msg_id", "caller_branch_id", "caller_job_id", "parent_job_id",
                           "followup_of_id", "result_artifact_id")


def test_the_jobs_columns_null_for_most_turns_are_indexed_only_where_set(db):
    """Migration 0020: every index leading with such a column is partial (``IS NOT NULL``), as
    is the one on status alone (the open jobs): a person's turn adds no entry to any of them."""
    job, partial = indexes("collab_job"), partial_indexes("collab_job")
    for column in JOB_COLUMNS_MOSTLY_NULL:
        leading = {name for name, columns in job.items() if columns[0] == column}
        assert leading and leading <= partial, (column, leading)
    assert {name for name, columns in job.items() if columns[0] == "status"} == {"job_status_lease"} <= partial
    assert "job_one_followup_per_job" in partial  # followup_of's one index


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")
def test_lookups_by_those_columns_still_use_their_partial_indexes(db):
    """An equality or ``IN`` on a column implies it IS NOT NULL: the services' reads, the cascades
    Django runs and PostgreSQL's own foreign-key checks (a parameter, in a generic plan) each
    still find their rows through the index (with sequential scans off, a plan that cannot use it
    scans the table)."""
    from django.db.models import Q
    from django.db.models.functions import Now

    reads = [
        (Job.objects.filter(caller_session_id="s"), "job_caller_session"),  # selectors.jobs: a session's callees
        (Job.objects.filter(Q(caller_msg_id__in=["m"]) | Q(prompt_msg_id__in=["m"])).exclude(caller_msg__isnull=True),
         "job_caller_msg"),  # selectors.dag: call edges
        (Job.objects.filter(caller_branch_id="b", followup_state="owed"), "job_caller_followup"),  # follow-ups owed
        (Job.objects.filter(caller_job_id__in=["j", "k"]), "job_caller_job"),  # a cascade (SET_NULL)
        (Job.objects.filter(parent_job_id__in=["j"]).exclude(status__in=["succeeded"]), "job_parent_job"),  # cancel
        (Job.objects.filter(result_artifact_id="a"), "job_result_artifact"),
        (Job.objects.filter(followup_of_id="j"), "job_one_followup_per_job"),
        (Job.objects.filter(status="queued", run_in_background=True), "job_status_lease"),  # reconcile: stale queued
        (Job.objects.running().filter(lease_expires_at__lt=Now()), "Index"),  # reconcile: expired leases (either index)
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for qs, index in reads:
            plan = qs.explain()
            assert index in plan and "Seq Scan" not in plan, (index, plan)
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        for column, index in [("caller_msg_id", "job_caller_msg"), ("caller_session_id", "job_caller_session"),
                              ("caller_job_id", "job_caller_job"), ("parent_job_id", "job_parent_job"),
                              ("result_artifact_id", "job_result_artifact"), ("caller_branch_id", "job_caller_followup")]:
            # the statement PostgreSQL runs for each row deleted from the referenced table
            cursor.execute(f"PREPARE ri_check(varchar) AS SELECT 1 FROM ONLY collab_job x "
                           f"WHERE {column} OPERATOR(pg_catalog.=) $1 FOR KEY SHARE OF x")
            cursor.execute("EXPLAIN EXECUTE ri_check('x')")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("DEALLOCATE ri_check")
            assert index in plan, (column, plan)


def test_the_indexes_that_back_rules_and_reads_remain(db):
    event, message, job = indexes("collab_event"), indexes("collab_message"), indexes("collab_job")
    assert {"event_seq_unique_per_project", "event_project_created", "event_actor"} <= set(event)
    assert ["session_id", "seq"] in event.values()  # event_seq_unique_per_session (an autoindex on SQLite)
    assert {"message_branch_depth", "message_session_keyset", "message_dedupe_key_unique"} <= set(message)
    assert {"job_branch_status", "job_session_status", "job_caller_followup", "job_status_lease",
            "job_one_active_per_branch", "job_one_followup_per_job"} <= set(job)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's varchar_pattern_ops indexes and fillfactor")
def test_per_turn_tables_keep_no_pattern_ops_copy_of_their_indexes(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = ANY(%s) AND indexdef LIKE '%%pattern_ops%%'",
                       [list(PER_TURN_TABLES)])
        assert cursor.fetchall() == []
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname IN ('collab_branch', 'collab_session')")
        assert dict(cursor.fetchall()) == {"collab_branch": ["fillfactor=70"], "collab_session": ["fillfactor=70"]}


def test_the_job_transition_guard_survives_the_migration(team, scripted_session, run_queued):
    """Migration 0018 rebuilds collab_job on SQLite, which drops its triggers: the guard of 0004
    and 0013 is put back (PostgreSQL keeps it)."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).json()["execution_id"]
    run_queued()
    assert Job.objects.get(pk=jid).status == "succeeded"
    with pytest.raises(DatabaseError), transaction.atomic():
        Job.objects.filter(pk=jid).update(status="running")


# --- a turn's prompt and answer, each stored once (migration 0019) ---------------------------------


def test_a_turn_stores_its_prompt_and_its_answer_once_and_answers_as_before(team, scripted_session, run_queued):
    """The prompt is in the prompt node, the answer in the final node; the job row holds neither
    (NULL), and every reader gets them back: the API's ``result``, the turn's ``{{prompt}}``."""
    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).json()["execution_id"]
    job = Job.objects.get(pk=jid)
    assert (job.prompt, job.prompt_msg.text) == (None, "hello")  # an idle branch: the node comes with the job
    run_queued()

    job = Job.objects.get(pk=jid)
    assert (job.prompt, job.result_text) == (None, None)
    assert Message.objects.get(job_id=jid, role="assistant").text == "echo: hello"
    assert (job.prompt_text, job.result) == ("hello", "echo: hello")
    got = api.get(f"/api/executions/{jid}").json()
    assert (got["status"], got["result"], got["is_error"], got["error_code"]) == ("succeeded", "echo: hello", False, "")
    assert [e["result"] for e in api.get("/api/executions", session=sid).json()] == ["echo: hello"]


def test_a_queued_prompt_stays_on_its_job_until_the_claim_writes_its_node(team, scripted_session, run_queued):
    """A turn queued behind a busy branch gets its prompt node at the claim: until then the job
    row is the prompt's only copy; the claim's UPDATE clears it as the node is written."""
    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    first = api.post(f"/api/sessions/{sid}/turns", {"prompt": "one"}).json()["execution_id"]
    second = api.post(f"/api/sessions/{sid}/turns", {"prompt": "two"}).json()["execution_id"]
    queued = Job.objects.get(pk=second)
    assert (queued.status, queued.prompt, queued.prompt_msg_id, queued.prompt_text) == ("queued", "two", None, "two")
    run_queued()

    for jid, prompt in ((first, "one"), (second, "two")):
        job = Job.objects.get(pk=jid)
        assert (job.prompt, job.prompt_msg.text, job.prompt_text, job.result) == (None, prompt, prompt, f"echo: {prompt}")


def test_a_prompt_that_never_got_its_node_is_kept_on_its_job(team, scripted_session, run_queued):
    """A queued turn whose branch is archived before it starts is refused without writing on the
    branch: its prompt stays in the job row, the one place it is."""
    api, sid = scripted_session(team.member, [{"text": "ok"}])
    api.post(f"/api/sessions/{sid}/turns", {"prompt": "one"})
    second = api.post(f"/api/sessions/{sid}/turns", {"prompt": "two"}).json()["execution_id"]
    job = Job.objects.get(pk=second)
    archived = api.post(f"/api/branches/{sid}:{job.parent_msg_id}/archive", {"reason": "done"})
    assert archived.status_code == 200, archived.content
    run_queued()

    job = Job.objects.get(pk=second)
    assert (job.status, job.prompt_msg_id, job.prompt, job.prompt_text) == ("failed", None, "two", "two")
    assert job.result_text and job.result == job.result_text == api.get(f"/api/executions/{second}").json()["result"]


def test_a_delegated_prompt_reads_back_without_the_header_its_node_carries(team, scripted_session, run_queued):
    """A task's node holds ``[task from …]`` before the prompt (written for the model); the turn's
    ``{{prompt}}`` is the prompt alone, read from the node."""
    from tests.conftest import tool

    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    other = api.post("/api/projects/alpha/sessions", {"title": "other", "agent_id": "bot"}).json()["id"]
    for s in (sid, other):
        api.post(f"/api/sessions/{s}/turns", {"prompt": "start"})
    run_queued()
    sender = Job.objects.get(session_id=sid).prompt_msg
    target = Job.objects.get(session_id=other).branch
    tool(api, f"{sid}:{sender.branch.tip_id}", "agent", prompt="do it", to=f"{other}:{target.tip_id}")
    run_queued()

    task = Job.objects.get(session_id=other, kind="task")
    assert task.prompt is None and task.prompt_header and task.prompt_msg.text == f"{task.prompt_header}\n\ndo it"
    assert (task.prompt_text, task.result) == ("do it", "echo: do it")


def test_a_result_that_is_not_the_whole_answer_is_stored_as_before(team, scripted_session, run_queued):
    """A result cut to its bound (the full text an Artifact) differs from the answer: the job row
    keeps it."""
    api, sid = scripted_session(team.member, [{"text": "{{prompt}}"}])
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "x" * 40_000}).json()["execution_id"]
    run_queued()

    job = Job.objects.get(pk=jid)
    assert job.result_artifact_id and job.result_text and "[full text: artifact" in job.result_text
    assert api.get(f"/api/executions/{jid}").json()["result"] == job.result_text
    assert Message.objects.get(job_id=jid, role="assistant").text == "x" * 40_000


def test_the_executions_listing_reads_the_answers_in_its_own_query(team, scripted_session, run_queued):
    """``GET /api/executions`` reads each result with its job (no query per job)."""
    from django.test.utils import CaptureQueriesContext

    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])

    def listing() -> tuple[int, list]:
        with CaptureQueriesContext(connection) as queries:
            rows = api.get("/api/executions", session=sid).json()
        return len(queries), [r["result"] for r in rows]

    api.post(f"/api/sessions/{sid}/turns", {"prompt": "p0"})
    run_queued()
    one, results = listing()
    assert results == ["echo: p0"]
    for i in range(1, 4):
        api.post(f"/api/sessions/{sid}/turns", {"prompt": f"p{i}"})
    run_queued()
    four, results = listing()
    assert results == [f"echo: p{i}" for i in (3, 2, 1, 0)]
    assert four == one


def test_the_admin_shows_a_jobs_prompt_and_result_from_the_rows_that_hold_them(team, scripted_session, run_queued,
                                                                               django_user_model, client):
    api, sid = scripted_session(team.member, [{"text": "pong-answer"}])
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "ping-prompt"}).json()["execution_id"]
    run_queued()
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.invalid", "pw-secret-123"))
    page = client.get(f"/admin/collab/job/{jid}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert '<div class="readonly">ping-prompt</div>' in text and '<div class="readonly">pong-answer</div>' in text


def test_the_migration_keeps_what_older_rows_answer(transactional_db, team, scripted_session, run_queued):
    """Migration 0019 both ways: back to 0018, every job row holds its prompt and result again;
    forward, the copies its nodes hold are cleared — and the API answers the same throughout."""
    from django.db.migrations.executor import MigrationExecutor

    api, sid = scripted_session(team.member, [{"text": "echo: {{prompt}}"}])
    jids = [api.post(f"/api/sessions/{sid}/turns", {"prompt": p}).json()["execution_id"] for p in ("one", "two")]
    run_queued()
    long = api.post(f"/api/sessions/{sid}/turns", {"prompt": "y" * 40_000}).json()["execution_id"]
    run_queued()
    # a transactional test's commits reach the broker: once the session's worker process runs (a
    # test before this one started it), it may have claimed a turn first, and run_queued then
    # returned while that turn was still running there
    before = {jid: poll(lambda jid=jid: (e := api.get(f"/api/executions/{jid}").json())["status"] in TERMINAL_STATUSES
                        and e, what=f"execution {jid} to end") for jid in [*jids, long]}

    def columns():
        return {j: (p, r) for j, p, r in Job.objects.filter(pk__in=before).values_list("pk", "prompt", "result_text")}

    old, new = ("collab", "0018_storage_per_turn"), ("collab", "0019_job_text_once")
    try:
        MigrationExecutor(connection).migrate([old])
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, prompt, result_text FROM collab_job WHERE id IN (%s, %s)", jids)
            assert sorted(cursor.fetchall()) == sorted([(jids[0], "one", "echo: one"), (jids[1], "two", "echo: two")])
        MigrationExecutor(connection).migrate([new])
        stored = columns()
        assert stored[jids[0]] == stored[jids[1]] == (None, None)
        assert stored[long][0] is None and "[full text: artifact" in stored[long][1]
        executor = MigrationExecutor(connection)  # the model's later columns (0021) again, for the API
        executor.migrate(executor.loader.graph.leaf_nodes())
        assert {jid: api.get(f"/api/executions/{jid}").json() for jid in before} == before
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_a_turns_nodes_name_their_job_in_their_column_alone(team, scripted_session, run_queued):
    """The prompt node, a tool-call node and the final answer keep no copy of their ``job`` column
    in their metadata, nor an empty header (readers take a missing one as none)."""
    from tests.conftest import step

    api, sid = scripted_session(team.member, [step({"name": "list_agents", "arguments": {}}), {"text": "done"}])
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hello"}).json()["execution_id"]
    run_queued()

    nodes = list(Message.objects.filter(session_id=sid).order_by("depth").values_list("role", "job_id", "metadata"))
    assert [(role, job) for role, job, _ in nodes] == [("user", jid), ("assistant", jid), ("tool", jid), ("assistant", jid)]
    prompt, call, result, final = (meta for _, _, meta in nodes)
    assert (prompt, call, final) == ({}, {}, {"final": True, "is_error": False})
    assert "job" not in result
    assert api.get(f"/api/executions/{jid}").json()["result"] == "done"


# a scripted turn's rows (its job, its two nodes, its five events), measured after the cuts that
# came with migration 0020: the text once, then 1,232 B of row (job 235 — it held 643 with the prompt and
# answer before 0019 —, two nodes 320 beside their text — 376 with their job in their metadata —,
# five events 677 — 728 with the job in the two message.created); the rest is headroom
TURN_ROW_BYTES_BEYOND_TEXT = 1_300


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_column_size: PostgreSQL's row sizes")
def test_a_turns_rows_hold_its_text_once_plus_a_small_constant(team, scripted_session, run_queued):
    """Storage ≈ the text plus a small constant per message: the rows
    a ~400-character turn writes hold its text once and a bounded constant beside it."""
    prompt = ("Storage bench: the quick brown fox jumps over the lazy dog. " * 4)[:200]
    api, sid = scripted_session(team.member, [{"text": "{{prompt}}"}])
    api.post(f"/api/sessions/{sid}/turns", {"prompt": "first"})
    run_queued()
    before = Event.objects.filter(session_id=sid).order_by("-seq").values_list("seq", flat=True).first()
    jid = api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt}).json()["execution_id"]
    run_queued()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT pg_column_size(j.*) FROM collab_job j WHERE id = %s),"
            " (SELECT SUM(pg_column_size(m.*)) FROM collab_message m WHERE job_id = %s),"
            " (SELECT SUM(pg_column_size(e.*)) FROM collab_event e WHERE session_id = %s AND seq > %s)",
            [jid, jid, sid, before])
        job, nodes, events = cursor.fetchone()
    text = 2 * len(prompt)
    assert [e["payload"]["job"] for e in events_after(sid, before, viewer=team.member)] == [jid] * 5
    print(f"job {job} B, nodes {nodes} B ({text} of text), events {events} B")
    assert job < 300  # neither the prompt nor the answer
    assert job + nodes + events <= text + TURN_ROW_BYTES_BEYOND_TEXT
