"""Appending nodes to a branch. Messages are immutable once written."""

from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from collab.events import MESSAGE_CREATED, deferred_event, message_event, message_event_ref, send_event_on_commit
from collab.models import Branch, Message, MessageKind
from collab.services.locking import lock_session
from collab.text import clean_data, clean_text


def _deferring(events: list):
    def defer(_session_id, type_, payload, actor=None, touch=None, stored=None):
        events.append(deferred_event(type_, payload, actor, touch=touch, stored=stored))
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
    """
    if move_tip and not session_locked:
        # the session's row first (its event log is written below): lock order session →
        # branch → job (collab/services/locking.py); a no-op if the caller holds it already
        lock_session(branch.session_id)
    text = clean_text(text or "")
    tool_calls = clean_data(tool_calls)
    metadata = clean_data(metadata)
    tool_call_id = clean_text(tool_call_id or "")[:100]  # a model's call id: the column holds 100
    pred = predecessor if predecessor is not None else (branch.tip or branch.forked_from)
    now = timezone.now()
    message = Message.objects.create(
        **({"id": message_id} if message_id else {}),
        session_id=branch.session_id,
        predecessor=pred,
        branch=branch,
        job=job,
        role=role,
        kind=kind,
        text=text,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        metadata=metadata or {},
        depth=(pred.depth + 1) if pred is not None else 0,
        turn=(pred.turn if pred is not None else 0) + (1 if starts_turn else 0),
        dedupe_key=dedupe_key,
        created_at=now,
    )
    if move_tip:
        # last activity orders name resolution and listings: the database's clock (SPEC §7)
        more = {"turns": F("turns") + 1} if ends_turn else {}
        Branch.objects.filter(pk=branch.pk).update(tip=message, chars=F("chars") + len(text), last_active_at=Now(), **more)
        branch.tip = message
        branch.chars += len(text)
        branch.last_active_at = now
    # the session's last activity rides on the event's own UPDATE of the session row (locked
    # first above, or by that UPDATE: the event locks it either way), not a commit of its own.
    # The log keeps a reference, not a second copy of the text (issue 15 item 1): its readers
    # rebuild the payload from this row (``collab.events.with_full_payloads``).
    (send_event_on_commit if events is None else _deferring(events))(
        branch.session_id, MESSAGE_CREATED, message_event(message), actor=actor, touch=now,
        stored=message_event_ref(message),
    )
    return message
