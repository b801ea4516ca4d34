"""What one scripted turn costs the database (the "Turn overhead" target of
docs/performance.md#targets): queries
and commits of a session's second turn — the admission the API makes (``access_session`` for
``turn.start``, then ``do_start_user_turn``: the API's ``POST …/turns`` once the request's caller
is authenticated)
and what a worker does with it (``runtime.loop.run_job``: the claim, the turn, the completion) —
counted in-process on real transactions, so the count cannot creep back up unnoticed.
``bench/turns.py`` prints the same figures beside the targets (≤ 20 queries; commits: the
physical minimum is 3 — the admission, the claim, the completion)."""

import pytest
from django.db import connection

from collab.models import Job, Session

# measured after the statements were cut (the two figures are what a turn costs today; lower them
# when a cut lands, never raise them without saying why in the commit). Before the second round of
# cuts: admission 16, worker 33 (32 + the project's webhooks read, FOR KEY SHARE, since webhooks).
# Since: the claim's UPDATE counts the project's running jobs (fair share), returns the claimed row
# (UPDATE … RETURNING) and whether results are owed to the branch (the first drain's question), as
# the completion's UPDATE returns the ended row; the completion knows the session from the claim;
# the turn is counted in the UPDATE that moves the tip; no stop check after the answer (the
# completion's locked read decides); no "is the branch busy" after its one running job ended; the
# project's waiting jobs are read with its running count in one statement; the admission's job row
# names its prompt node from its INSERT on; the completion asks in one statement what waits for
# the branch (inbox, owed results, its next queued job, the project's waiting jobs). Events: on PostgreSQL one statement writes all the
# events a step has for one session (a data-modifying CTE: the session's numbers and the rows —
# the prompt node's and job.queued; job.running; the answer's and job.succeeded); SQLite writes
# each in two (the number, then the row).
# Third round (the admission now counted with the API's own access read of the session, 2 statements:
# the session with its project and spec, the caller's role): a node's INSERT takes its depth and
# turn from its predecessor in the same statement (no read of the tip) and, on PostgreSQL, moves
# the branch's tip in it too (a data-modifying CTE); the selected HEAD follows a person's turn in
# the statement that numbers its events; the completion's UPDATE decides a stopping job's end
# itself (no locked read before it); the "what waits" probe says whether the project has webhooks
# (none: no read of them); the branch's spec is the session's, read with it by the access layer.
# Then, on PostgreSQL, a node's INSERT and its tip's UPDATE ride on the statement that numbers its
# event (collab.events.Rider): a node is one statement, with its events and the HEAD's move.
# Fourth round: the access layer reads the session and the caller's standing in it (project role,
# share) in one statement and decides in Python (``collab.access._with_viewer_role``).
if connection.vendor == "postgresql":
    ADMISSION_QUERIES, WORKER_QUERIES = 7, 11
else:
    ADMISSION_QUERIES, WORKER_QUERIES = 12, 17
ADMISSION_COMMITS = 1
WORKER_COMMITS = 2
# one background ``agent`` call in a step (a coordinator fanning out): the call's standing (the
# session with the caller's role, one statement), the spawn's transaction — the two sessions'
# locks, the caller's branch, the fan-out count, the new branch (its lane beside the caller's
# read from memory), the fence on the calling job, the job — with the new branch's events, its
# prompt node and job.queued in one statement and the attach node with agent.spawned in another;
# then the stop check and the tool's result node. Was 23 on PostgreSQL before the role was read
# once a call, the locks taken once a spawn and the spawn's events batched.
SPAWN_QUERIES = 13 if connection.vendor == "postgresql" else 27


WRITES = ("INSERT", "UPDATE", "DELETE")


class Counted:
    """Queries, and commits that wrote a Trellis row, on the default connection: a transaction
    (``connection.commit``, which ``transaction.atomic`` calls) with a write in it, or a write
    in autocommit. The ORM broker's queue is not counted (a scaled deployment's broker is Redis)."""

    def __enter__(self):
        self.queries, self.commits, self._wrote = [], 0, False
        self._commit = connection.commit
        connection.commit = self._counting_commit
        self._wrapper = connection.execute_wrapper(self._record)
        self._wrapper.__enter__()
        return self

    def _record(self, execute, sql, params, many, context):
        if "django_q_" in sql or sql.lstrip().upper().startswith("BEGIN"):
            # the ORM broker's queue (a scaled deployment's is Redis); SQLite's explicit BEGIN
            # IMMEDIATE (a transaction's start, which PostgreSQL's driver does not show)
            return execute(sql, params, many, context)
        self.queries.append(sql)
        if sql.lstrip().split(None, 1)[0].upper() in WRITES:
            if connection.in_atomic_block:
                self._wrote = True
            else:
                self.commits += 1
        return execute(sql, params, many, context)

    def _counting_commit(self, *args, **kwargs):
        self.commits += self._wrote
        self._wrote = False
        return self._commit(*args, **kwargs)

    def __exit__(self, *exc):
        self._wrapper.__exit__(*exc)
        del connection.commit

    def __len__(self):
        return len(self.queries)

    def listing(self) -> str:
        return "\n".join(" ".join(q.split())[:160] for q in self.queries)


@pytest.fixture
def no_worker(monkeypatch):
    """This process runs the turns (``run_job``): the tasks the admission and the naming hand to
    the broker after commit are kept here, so that a worker process an earlier test of the run
    started cannot take the job (or rename the branch) while it is being counted."""
    from collab import brokers

    handed = []
    monkeypatch.setattr(brokers, "async_task", lambda *args, **kwargs: handed.append(args))
    return handed


@pytest.fixture
def second_turn(transactional_db, team, no_worker):
    """A scripted agent's session with one turn behind it; returns (user, session)."""
    from collab.models import AgentSpec
    from collab.runtime.loop import run_job
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "ok {{prompt}}"}])
    session = do_create_session(team.member, team.alpha, title="queries", agent_id="echo")
    run_job(do_start_user_turn(team.member, session, "first").pk)
    return team.member, Session.objects.get(pk=session.pk)


def test_a_scripted_turn_costs_a_bounded_number_of_queries(second_turn):
    """A scripted turn's queries, admission and worker side, stay within the counts
    measured when they were cut; the turn's result is what it was."""
    from collab.access import access_session
    from collab.runtime.loop import run_job
    from collab.services.turns import do_start_user_turn

    user, session = second_turn
    with Counted() as admission:  # what the API's POST …/turns does once the caller is known
        session = access_session(user, session.pk, "turn.start")
        job = do_start_user_turn(user, session, "second")
    with Counted() as worker:
        assert run_job(job.pk) == "succeeded"
    job = Job.objects.get(pk=job.pk)
    assert job.status == "succeeded" and job.result == "ok second"
    # the person's selection followed their turn to its answer, the branch's tip
    assert job.prompt_msg.text == "second" and Session.objects.get(pk=session.pk).head_id == job.branch.tip_id
    print(f"admission {len(admission)} queries / {admission.commits} commits, "
          f"worker {len(worker)} queries / {worker.commits} commits")
    assert len(admission) <= ADMISSION_QUERIES, admission.listing()
    assert len(worker) <= WORKER_QUERIES, worker.listing()
    # the physical minimum: the admission; the claim and the completion
    assert (admission.commits, worker.commits) == (ADMISSION_COMMITS, WORKER_COMMITS)


def test_a_turns_events_keep_their_order_and_numbers(second_turn):
    """The events a turn writes together (one statement on PostgreSQL) come in the order they
    were made, numbered one after another from the session's count, which ends at the last."""
    from collab.events import with_full_payloads
    from collab.models import Event
    from collab.runtime.loop import run_job
    from collab.services.turns import do_start_user_turn

    user, session = second_turn
    before = Session.objects.get(pk=session.pk).last_event_seq
    job = do_start_user_turn(user, session, "second")
    run_job(job.pk)
    # read back as every reader of the log does (the rows keep references: test_storage_per_turn)
    events = with_full_payloads(Event.objects.filter(session_id=session.pk, seq__gt=before).order_by("seq"))
    assert [e.type for e in events] == ["message.created", "job.queued", "job.running", "message.created", "job.succeeded"]
    assert [e.seq for e in events] == list(range(before + 1, before + 6))
    assert Session.objects.get(pk=session.pk).last_event_seq == before + 5
    assert {e.project_id for e in events} == {session.project_id}
    assert events[0].payload["text"] == "second" and events[3].payload["text"] == "ok second"
    assert [e.payload["status"] for e in events if e.type.startswith("job.")] == ["queued", "running", "succeeded"]
    assert events[1].actor_id == user.pk and events[0].actor_id == user.pk


def test_a_turns_nodes_take_depth_turn_and_tip_from_the_statements_that_write_them(second_turn):
    """The nodes a turn writes (their depth and turn taken from the predecessor inside the
    INSERT, the branch's tip and counters moved in the same statement on PostgreSQL) are what a
    read of the rows says, in memory as in the database, and the person's selection follows."""
    from collab.models import Branch, Message
    from collab.runtime.loop import run_job
    from collab.services.turns import do_start_user_turn

    user, session = second_turn
    branch_before = Branch.objects.get(session_id=session.pk)
    first_answer = Message.objects.get(pk=branch_before.tip_id)
    job = do_start_user_turn(user, session, "second")
    assert job.prompt_msg.depth == first_answer.depth + 1 and job.prompt_msg.turn == first_answer.turn + 1
    run_job(job.pk)
    prompt = Message.objects.get(pk=job.prompt_msg_id)
    assert (prompt.predecessor_id, prompt.depth, prompt.turn) == (first_answer.pk, first_answer.depth + 1,
                                                                   first_answer.turn + 1)
    branch = Branch.objects.get(pk=branch_before.pk)
    answer = Message.objects.get(pk=branch.tip_id)
    assert (answer.predecessor_id, answer.depth, answer.turn, answer.text) == (prompt.pk, prompt.depth + 1,
                                                                                prompt.turn, "ok second")
    assert branch.turns == branch_before.turns + 1
    assert branch.chars == branch_before.chars + len("second") + len("ok second")
    assert Session.objects.get(pk=session.pk).head_id == answer.pk


def test_a_node_after_a_missing_predecessor_is_refused_and_writes_nothing(second_turn):
    """A node whose predecessor row is gone is refused by the database (its depth cannot be
    taken), and neither the node, the tip's move nor its event is left behind."""
    from django.db import IntegrityError, transaction

    from collab.models import Branch, Event, Message
    from collab.services.messages import append_message

    _user, session = second_turn
    branch = Branch.objects.get(session_id=session.pk)
    before = (Message.objects.count(), Event.objects.count(), branch.tip_id, branch.chars)
    ghost = Message(pk="000000000000", session_id=session.pk)
    with pytest.raises(IntegrityError), transaction.atomic():
        append_message(branch, role="user", text="orphan", predecessor=ghost)
    branch = Branch.objects.get(pk=branch.pk)
    assert (Message.objects.count(), Event.objects.count(), branch.tip_id, branch.chars) == before


@pytest.fixture
def coordinator(transactional_db, team, no_worker):
    """A session whose agent spawns ``n`` background children in one step of its turn: ``make(n)``
    returns (user, session, the queued turn)."""
    from collab.models import AgentSpec
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn
    from tests.conftest import agent_call, step

    def make(n):
        script = {"user": [step(*(agent_call(f"child {i}") for i in range(n))), {"text": "spawned"}],
                  "spawn": [{"text": "done"}]}
        AgentSpec.objects.update_or_create(project=team.alpha, agent_id=f"fan{n}",
                                           defaults={"provider": "scripted", "script": script})
        session = do_create_session(team.member, team.alpha, title=f"fan {n}", agent_id=f"fan{n}")
        return team.member, session, do_start_user_turn(team.member, session, "go")

    return make


def test_a_background_spawn_in_a_step_costs_a_bounded_number_of_queries(coordinator):
    """What one more ``agent(run_in_background=true)`` call in a coordinator's step costs the
    worker: the difference between a step of 1 and a step of 5 such calls, over 4."""
    from collab.runtime.loop import run_job

    costs = {}
    for n in (1, 5):
        _user, _session, job = coordinator(n)
        with Counted() as worker:
            assert run_job(job.pk) == "succeeded"
        costs[n] = worker
        assert Job.objects.filter(parent_job=job, kind="spawn", status="queued").count() == n
    per_spawn = (len(costs[5]) - len(costs[1])) / 4
    print(f"a background spawn: {per_spawn} queries")
    assert per_spawn <= SPAWN_QUERIES, costs[5].listing()


def test_a_spawns_events_come_in_order_on_the_coordinators_log(coordinator):
    """The events a spawn writes in two statements (the new branch's, its prompt node's and job's;
    the attach node's and agent.spawned) are numbered one after another, in the order they were
    made, and name what they describe."""
    from collab.events import with_full_payloads
    from collab.models import Event
    from collab.runtime.loop import run_job

    _user, session, job = coordinator(1)
    run_job(job.pk)
    child = Job.objects.get(parent_job=job)
    events = list(with_full_payloads(Event.objects.filter(session_id=session.pk).order_by("seq")))
    types = [e.type for e in events]
    start = types.index("branch.created")
    spawn = events[start:start + 5]
    assert [e.type for e in spawn] == ["branch.created", "message.created", "job.queued", "message.created",
                                       "agent.spawned"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert spawn[0].payload["branch"] == child.branch_id == spawn[4].payload["branch"]
    assert spawn[1].payload["id"] == child.prompt_msg_id and spawn[2].payload["job"] == child.pk
    assert spawn[3].payload["kind"] == "attach" and spawn[4].payload["attach"] == spawn[3].payload["id"]
