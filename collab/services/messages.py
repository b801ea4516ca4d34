"""Appending nodes to a branch. Messages are immutable once written."""

import functools

from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from collab.events import (
    MESSAGE_CREATED,
    Rider,
    deferred_event,
    message_event,
    message_event_ref,
    rides_on_events,
    send_event_on_commit,
)
from collab.models import Branch, Message, MessageKind
from collab.services.locking import lock_session
from collab.text import clean_data, clean_text
from collab.infra.prepared import mark_saved


def _deferring(events: list):
    def defer(_session_id, type_, payload, actor=None, touch=None, stored=None, head=None, rider=None):
        if rider is not None and any(event.rider is not None for event in events):
            # one statement sees one snapshot: a second node could not read the first as its
            # predecessor there (no caller defers two; this keeps it so)
            raise RuntimeError("one deferred node per event statement")
        events.append(deferred_event(type_, payload, actor, touch=touch, stored=stored, head=head, rider=rider))
    return defer


def append_message(
    branch: Branch,
    *,
    role: str,
    text: str = "",
    kind: str = MessageKind.NORMAL,
    job=None,
    tool_calls=None,
    tool_call_id: str = "",
    metadata: dict | None = None,
    dedupe_key: str | None = None,
    predecessor: Message | None = None,
    starts_turn: bool = False,
    move_tip: bool = True,
    actor=None,
    session_locked: bool = False,
    ends_turn: bool = False,
    message_id: str | None = None,
    events: list | None = None,
    moves_head: bool = False,
) -> Message:
    """Write a node after ``predecessor`` (default: the branch tip, or its fork point)
    and, unless ``move_tip`` is False (side nodes such as attach pointers), make it the tip.

    Precondition: inside ``transaction.atomic``, and the caller owns the branch's
    write side — it holds the branch row lock or runs the branch's active job.
    Cost is O(1) in history length: only the predecessor's depth and turn are read.
    Text, tool calls and metadata pass the text boundary (``collab.text``) here, whoever wrote them.
    ``session_locked``: the caller holds the session's row lock already (taken first, in the
    lock order), so it is not taken again here. ``ends_turn``: the node closes a turn that ran;
    the branch's ``turns`` counts it in the statement that moves the tip (the caller counts it
    in memory). ``message_id``: the node's id, when a row written before it names it already.
    ``events``: a list the node's ``message.created`` is added to, for the caller to send with
    the next event of the session in one statement (``collab.events.send_events_on_commit``).
    ``moves_head``: a person's own turn — the session's selected HEAD follows this node if it is
    unset or on this branch (agents' turns never move it), set by the statement that numbers
    the node's event.
    """
    if move_tip and not session_locked:
        # the session's row first (its event log is written below): lock order session →
        # branch → job (collab/services/locking.py); a no-op if the caller holds it already
        lock_session(branch.session_id)
    text = clean_text(text or "")
    tool_calls = clean_data(tool_calls)
    metadata = clean_data(metadata)
    tool_call_id = clean_text(tool_call_id or "")[:100]  # a model's call id: the column holds 100
    if predecessor is not None:
        pred_id = predecessor.pk
    else:  # the branch's tip, or its fork point: by id, never loading the row
        pred_id = branch.tip_id or branch.forked_from_id
    now = timezone.now()
    message = Message(
        **({"id": message_id} if message_id else {}),
        session_id=branch.session_id,
        predecessor_id=pred_id,
        branch=branch,
        job=job,
        role=role,
        kind=kind,
        text=text,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        metadata=metadata or {},
        dedupe_key=dedupe_key,
        created_at=now,
    )
    tip_of = branch if move_tip else None
    rider = node_writes(message, starts_turn=starts_turn, tip_of=tip_of, ends_turn=ends_turn)
    if not rides_on_events():
        write_node_now(rider, message, tip_of=tip_of, ends_turn=ends_turn)
        rider = None
    if move_tip:  # the in-memory branch follows what the statement wrote
        branch.tip = message
        branch.chars += len(text)
        branch.last_active_at = now
    # the session's last activity rides on the event's own UPDATE of the session row (locked
    # first above, or by that UPDATE: the event locks it either way), not a commit of its own.
    # The log keeps a reference, not a second copy of the text: its readers
    # rebuild the payload from this row (``collab.events.with_full_payloads``).
    (send_event_on_commit if events is None else _deferring(events))(
        branch.session_id, MESSAGE_CREATED, message_event(message), actor=actor, touch=now,
        stored=message_event_ref(message), head=(branch.pk, message.pk) if moves_head else None, rider=rider,
    )
    return message


@functools.cache
def _node_fields() -> tuple:
    """Message's columns but ``depth`` and ``turn`` (the INSERT takes those from the predecessor)."""
    return tuple(f for f in Message._meta.concrete_fields if f.attname not in ("depth", "turn"))


def node_writes(message: Message, *, starts_turn: bool, tip_of: Branch | None, ends_turn: bool = False) -> Rider:
    """The statements that write ``message`` (unsaved, ``predecessor_id`` set or None): its
    INSERT, which takes its ``depth`` and ``turn`` from its predecessor's row — the node after
    it on the predecessor's lineage, one turn on if it ``starts_turn`` — so the predecessor is
    never read on its own (a read of the tip node would be a statement at every
    admission and every completion); and, with ``tip_of``, the UPDATE that makes it that
    branch's tip, its ``chars`` growing by the text and (``ends_turn``) its ``turns`` by one.
    On PostgreSQL they ride on the statement that numbers the node's event (``Rider``).

    Reading the predecessor without a lock is safe: messages are immutable, and the caller
    holds the branch's write side (its row lock, or its active job), under which its tip
    committed before this statement's snapshot was taken. A predecessor that does not exist
    leaves ``depth`` NULL: the database refuses the row (IntegrityError), as its foreign key
    would. The values pass each field's own preparation, so a field added to Message is
    written here too."""
    fields = _node_fields()
    qn = connection.ops.quote_name
    columns = [*(qn(f.column) for f in fields), qn("depth"), qn("turn")]
    params = [f.get_db_prep_save(f.pre_save(message, add=True), connection) for f in fields]
    table = qn(Message._meta.db_table)
    if message.predecessor_id is None:
        depth_turn, more = "0, %s", [int(starts_turn)]
    else:
        depth_turn = (f"(SELECT depth + 1 FROM {table} WHERE id = %s), "
                      f"(SELECT turn + %s FROM {table} WHERE id = %s)")
        more = [message.predecessor_id, int(starts_turn), message.predecessor_id]
    statements = [(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(fields))}, "
                   f"{depth_turn}) RETURNING depth, turn", params + more)]
    if tip_of is not None:
        turns = ", turns = turns + 1" if ends_turn else ""
        statements.append((f"UPDATE {qn(Branch._meta.db_table)} SET tip_id = %s, chars = chars + %s, "
                           f"last_active_at = STATEMENT_TIMESTAMP(){turns} WHERE id = %s",
                           [message.pk, len(message.text), tip_of.pk]))

    def written(depth_turn):
        message.depth, message.turn = depth_turn
        mark_saved(message, connection.alias)

    return Rider(tuple(statements), ("depth", "turn"), written)


def write_node_now(rider: Rider, message: Message, *, tip_of: Branch | None, ends_turn: bool) -> None:
    """SQLite, which has no data-modifying CTE: the node's INSERT (RETURNING its depth and
    turn), then its branch's tip moved by the ORM (``Now()`` on SQLite's clock)."""
    sql, params = rider.statements[0]
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        rider.done(cursor.fetchone())
    if tip_of is not None:
        more = {"turns": F("turns") + 1} if ends_turn else {}
        Branch.objects.filter(pk=tip_of.pk).update(tip=message, chars=F("chars") + len(message.text),
                                                   last_active_at=Now(), **more)
