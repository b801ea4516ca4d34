"""The event log: written in the transaction, pushed to listeners after commit
(``collab.realtime.push``).

``send_event_on_commit`` is the only way collab code records an event.
Sequence numbers come from ``Session.last_event_seq``: bumping it row-locks the
session until commit, so a session's events commit in ``seq`` order and a
client resuming with ``?after=SEQ`` can never skip one.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

from django.db import connection, transaction

from collab.models import Event, Job, Message
from collab.realtime.push import push_events
from collab.text import bound_text, clean_data
from collab.infra.prepared import mark_saved


MAX_TEXT_IN_EVENT = 4000


class Rider(NamedTuple):
    """Writes that ride on the statement that numbers a session's events (PostgreSQL: a node's
    INSERT and its branch's tip, which would otherwise be a statement each): ``statements``,
    data-modifying (sql, params) run in it as CTEs, in this order, on its one snapshot; the
    first one's RETURNING names ``returns``, whose values (one row) are handed to ``done``."""
    statements: tuple
    returns: tuple
    done: Callable


def rides_on_events() -> bool:
    """Whether writes can ride on the event statement (``Rider``): PostgreSQL's data-modifying
    CTEs. SQLite has none: its writes run on their own."""
    return connection.vendor == "postgresql"


def _session_sets(touch=None, head=None) -> tuple[str, list]:
    """What the statement that numbers a session's events also sets on the session row (which
    it has locked): ``touch``, a time that becomes its ``last_active_at``; ``head``, a
    (branch id, message id) the selected HEAD follows when it is unset or on that branch — a
    person's turn moves their selection along the branch they are on (riding here saves
    a statement of its own at every admission and completion of a person's turn). The HEAD's
    branch is read in the statement, from the message it names: messages are immutable, and
    the session row it hangs off is the one being updated."""
    sql, params = "", []
    if touch is not None:
        sql += ", last_active_at = %s"
        params.append(connection.ops.adapt_datetimefield_value(touch))
    if head is not None:
        # the HEAD's branch by its id alone: a subquery that also names the branch can be planned
        # as a walk through the branch's messages (a prepared statement's generic plan, made while
        # the table was small, kept it: one read per message of the branch at every turn)
        sql += (", head_id = CASE WHEN head_id IS NULL OR (SELECT h.branch_id FROM collab_message h "
                "WHERE h.id = collab_session.head_id) = %s THEN %s ELSE head_id END")
        params.extend(head)
    return sql, params


def _next_seq(session_id: str, touch=None, head=None) -> tuple[int, int]:
    """(seq, project id) for the session's next event; row-locks the session until commit.
    ``touch``, ``head``: what else the statement sets on the session (``_session_sets``)."""
    sets, params = _session_sets(touch, head)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE collab_session SET last_event_seq = last_event_seq + 1{sets} WHERE id = %s "
            "RETURNING last_event_seq, project_id",
            [*params, session_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"session {session_id} does not exist")
    return row[0], row[1]


def _append_events(session_id: str, events: list[Event], touch=None, head=None, riders=()) -> None:
    """PostgreSQL: take the session's next numbers (row-locking it until commit, as ``_next_seq``)
    and insert ``events`` with them, in one statement — a data-modifying CTE, whose UPDATE runs
    exactly once (bumping the number by their count) and hands its RETURNING row to the INSERT;
    the i-th event (from 1) gets ``last_event_seq - count + i``. The events come unsaved without
    ``seq``/``project`` (both read from the session row the UPDATE locked) and leave saved;
    ``touch``/``head`` as ``_session_sets``; ``riders``' writes run first in the same statement
    (``Rider``), each handed what its RETURNING gave. The
    columns come from the model, so a field added to Event is written here too."""
    fields, columns, row_sql, names = _event_rows_shape()
    qn = connection.ops.quote_name
    params = []
    for i, event in enumerate(events, start=1):
        params.append(i)
        params.extend(f.get_db_prep_save(f.pre_save(event, add=True), connection) for f in fields)
    rows_sql = [row_sql] * len(events)
    count = len(events)
    sets, sets_params = _session_sets(touch, head)
    pk = Event._meta.pk.column
    ctes, cte_params, extra = [], [], []
    for r, rider in enumerate(riders):
        for n, (sql, rider_params) in enumerate(rider.statements):
            ctes.append(f"r{r}_{n} AS ({sql}), ")
            cte_params.extend(rider_params)
        extra.extend(f", (SELECT {column} FROM r{r}_0)" for column in rider.returns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {''.join(ctes)}s AS (UPDATE collab_session SET last_event_seq = last_event_seq + %s{sets} WHERE id = %s "
            f"RETURNING last_event_seq, project_id), "
            f"e AS (INSERT INTO {Event._meta.db_table} ({qn('project_id')}, {qn('seq')}, {', '.join(columns)}) "
            f"SELECT s.project_id, s.last_event_seq - %s + v.i, {', '.join('v.' + n for n in names[1:])} "
            f"FROM s CROSS JOIN (VALUES {', '.join(rows_sql)}) AS v({', '.join(names)}) "
            f"RETURNING {pk}, seq, project_id) "
            f"SELECT {pk}, seq, project_id{''.join(extra)} FROM e",
            [*cte_params, count, *sets_params, session_id, count, *params],
        )
        returned = cursor.fetchall()
    if returned and riders:
        values = returned[0][3:]
        for rider in riders:
            rider.done(values[:len(rider.returns)])
            values = values[len(rider.returns):]
    returned = [row[:3] for row in returned]
    if len(returned) != count:
        raise LookupError(f"session {session_id} does not exist")
    first = min(seq for _pk, seq, _project in returned)
    for pk_value, seq, project_id in returned:
        event = events[seq - first]
        event.pk, event.seq, event.project_id = pk_value, seq, project_id
        mark_saved(event, connection.alias)


@functools.cache
def _event_rows_shape() -> tuple:
    """What ``_append_events`` writes of each event, the same for every statement (built once per
    process; PostgreSQL's types): the fields, their quoted columns, one row of the VALUES list
    (its number, then a typed placeholder per field) and the VALUES list's column names."""
    fields = tuple(f for f in Event._meta.concrete_fields if not f.primary_key and f.attname not in ("seq", "project_id"))
    qn = connection.ops.quote_name
    columns = [qn(f.column) for f in fields]
    row_sql = f"({', '.join(['%s::integer', *(f'CAST(%s AS {f.db_type(connection)})' for f in fields)])})"
    return fields, columns, row_sql, ["i", *(f"c{n}" for n in range(len(fields)))]


def _next_project_seq(project_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE accounts_project SET last_event_seq = last_event_seq + 1 WHERE id = %s RETURNING last_event_seq",
            [project_id],
        )
        return cursor.fetchone()[0]


def send_event_on_commit(session_id: str, type: str, payload: dict, actor=None, *, touch=None,
                         stored: dict | None = None, head: tuple | None = None, rider: Rider | None = None) -> Event:
    """Append an event to the session's log now; push it to live listeners after commit.

    Must be called inside ``transaction.atomic``: the event commits or rolls back
    with the change it describes. ``touch`` (a time) also sets the session's last activity,
    in the statement that takes the event's number (no query or commit of its own).
    ``stored``: what the log row keeps instead of ``payload``, when every reader of the log puts
    the rest back (``message_event_ref`` / ``with_full_payloads``); live listeners get ``payload``.
    ``head``: (branch id, message id) — the session's selected HEAD follows that node if it is
    unset or on that branch, in the same statement (``_session_sets``). ``rider``: writes that
    run in that statement too (``Rider``, PostgreSQL only).
    """
    return send_events_on_commit(
        session_id, [deferred_event(type, payload, actor, touch=touch, stored=stored, head=head, rider=rider)])[0]


def send_events_on_commit(session_id: str, events: list) -> list[Event]:
    """``send_event_on_commit`` for several events of one session at once, in this order: on
    PostgreSQL one statement takes their numbers (the session's ``last_event_seq`` bumped by
    their count) and inserts them all; one push after commit sends them in order. ``events``:
    what ``deferred_event`` makes; the last ``touch`` among them sets the session's last activity,
    the last ``head`` its selected HEAD."""
    if not connection.in_atomic_block:
        raise RuntimeError("events must be sent inside transaction.atomic (they commit with their change)")
    rows, payloads = [], []
    for type_, payload, actor, _touch, stored, _head, _rider in events:
        payloads.append(clean_data(payload))
        rows.append(Event(session_id=session_id, type=type_, actor_id=getattr(actor, "pk", actor),
                          payload=payloads[-1] if stored is None else clean_data(stored)))
    if not rows:
        return []
    touch = next((event.touch for event in reversed(events) if event.touch is not None), None)
    head = next((event.head for event in reversed(events) if event.head is not None), None)
    riders = [event.rider for event in events if event.rider is not None]
    if rides_on_events():  # PostgreSQL: the numbers, the rows and what rides on them in one statement
        _append_events(session_id, rows, touch, head, riders)
    else:  # SQLite: one event after the other (number, then row)
        if riders:
            raise RuntimeError("writes ride on the event statement only on PostgreSQL (rides_on_events)")
        for n, row in enumerate(rows):
            row.seq, row.project_id = _next_seq(session_id, *((touch, head) if n == 0 else ()))
            row.save(force_insert=True)
    wires = [{**row.as_wire(), "payload": payload} for row, payload in zip(rows, payloads)]
    transaction.on_commit(lambda: push_events(session_id, wires))
    return rows


class Deferred(NamedTuple):
    type: str
    payload: dict
    actor: object
    touch: object
    stored: dict | None
    head: tuple | None
    rider: Rider | None = None


def deferred_event(type: str, payload: dict, actor=None, *, touch=None, stored: dict | None = None,
                   head: tuple | None = None, rider: Rider | None = None) -> Deferred:
    """An event to send later with others of its session (``send_events_on_commit``); the
    arguments mean what they mean to ``send_event_on_commit``."""
    return Deferred(type, payload, actor, touch, stored, head, rider)


def clip(text: str, limit: int = MAX_TEXT_IN_EVENT) -> dict:
    """Text for an event payload: the log stays small (head and tail, ``collab.text.bound_text``),
    the message row keeps the whole."""
    bounded, truncated = bound_text(text, limit)
    if not truncated:
        return {"text": text}
    return {"text": bounded, "text_truncated": True, "text_length": len(text)}


MESSAGE_CREATED = "message.created"
MESSAGE_EVENT_FIELDS = ("id", "session_id", "branch_id", "predecessor_id", "role", "kind", "job_id", "tool_calls", "text")


def message_event(message: Message) -> dict:
    """The payload clients receive in a ``message.created`` event (docs/contract.md#events): the message's
    fields, its text clipped (``clip``). Live listeners get it as written; the log keeps only
    ``message_event_ref`` and every read of the log rebuilds this from the (immutable) message
    row — the text is stored once, in the message."""
    return {
        "id": message.id,
        "address": message.address,
        "branch": message.branch_id,
        "predecessor": message.predecessor_id,
        "role": message.role,
        "kind": message.kind,
        "job": message.job_id,
        "tool_calls": message.tool_calls,
        **clip(message.text),
    }


def message_event_ref(message: Message) -> dict:
    """What the log row of a ``message.created`` holds: the message's id (replays cut the DAG
    at it, ``collab.selectors.dag.replay_cutoff``). The rest is the message row's, its job
    included: the node is immutable and its job is deleted only with its session, whose log
    goes with it (one execution's events are found through the messages it wrote:
    ``collab.selectors.events.events_after``). Rows written before hold the job too."""
    return {"id": message.id}


def job_event_ref(type: str, payload: dict) -> dict:
    """What the log row of a job's state change (``job.queued``, ``job.running``, ``job.<end>``,
    payload ``collab.services.admission.job_wire``) holds: its fields less those a reader
    derives — the status its type names, the job's kind and branch (fixed for its life), and
    ``is_error``/``error_code`` while they are unset. ``job`` and ``version`` always stay."""
    derived = _job_derived(type, payload.get("kind"), payload.get("branch"))
    return {k: v for k, v in payload.items() if k not in derived or derived[k] != v}


def _job_derived(type: str, kind, branch) -> dict:
    return {"status": type.removeprefix("job."), "kind": kind, "branch": branch, "is_error": False, "error_code": ""}


def _is_job_ref(event) -> bool:
    return (event.type.startswith("job.") and isinstance(event.payload, dict) and "kind" not in event.payload
            and isinstance(event.payload.get("job"), str))


def with_full_payloads(events) -> list:
    """``Event`` rows read from the log, each stored as a reference given back the payload its
    live listeners got: a ``message.created`` holding ``message_event_ref`` its message's fields
    (``message_event``), a job's state change holding ``job_event_ref`` the fields derived from
    its type and job. One query for the messages and one for the jobs, none without such rows.
    Rows that hold the whole payload (written before payloads were stored as references) are left
    as they are. In place — log rows are never saved again — and returned as a list. Every reader
    of event payloads goes through here (API, sockets, SSE, pages, activity, audit)."""
    events = list(events)
    refs = [e for e in events if e.type == MESSAGE_CREATED and isinstance(e.payload, dict)
            and "role" not in e.payload and isinstance(e.payload.get("id"), str)]
    if refs:
        messages = Message.objects.only(*MESSAGE_EVENT_FIELDS).in_bulk({e.payload["id"] for e in refs})
        for e in refs:
            if (message := messages.get(e.payload["id"])) is not None:
                e.payload = {**message_event(message), **e.payload}
    job_refs = [e for e in events if _is_job_ref(e)]
    if job_refs:
        jobs = {pk: (kind, branch) for pk, kind, branch in
                Job.objects.filter(pk__in={e.payload["job"] for e in job_refs}).values_list("pk", "kind", "branch_id")}
        for e in job_refs:
            if (job := jobs.get(e.payload["job"])) is not None:
                derived = _job_derived(e.type, *job)
                # job_wire's order: job, status, version, kind, branch, is_error, error_code
                e.payload = {"job": None, "status": derived.pop("status"), "version": None, **derived, **e.payload}
    return events


def record_project_event(project_id: int, type: str, payload: dict, actor=None) -> Event:
    """A project-level audit event (memberships, limits, tokens): logged, not streamed.
    Must run inside ``transaction.atomic`` like the change it records."""
    if not connection.in_atomic_block:
        raise RuntimeError("record_project_event must run inside transaction.atomic")
    return Event.objects.create(
        project_id=project_id, session=None, seq=_next_project_seq(project_id), type=type, payload=clean_data(payload),
        actor_id=getattr(actor, "pk", actor),
    )
