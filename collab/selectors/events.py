from django.db.models import Q
from django.db.models.fields.json import KT

from collab.events import MESSAGE_CREATED, with_full_payloads
from collab.models import Event, Message, Session
from collab.selectors.redact import Memo, redact_wires

PAGE = 500


def events_after(session_id: str, after: int = 0, limit: int = PAGE, *, viewer, memo: Memo | None = None,
                 job: str | None = None) -> list[dict]:
    """A session's events with ``seq > after``, ascending, as wires ``viewer`` may see: fields
    naming a session they may not see are blanked (at most four more queries per
    page, and up to two that give events stored as references their whole payload back:
    ``collab.events.with_full_payloads``). With ``job``, only the events about that execution:
    those naming it in ``payload.job`` (its status changes, its deltas) and the ``message.created``
    of the messages it wrote (their log rows name the message alone, ``message_event_ref``; a
    subquery of the same statement). Callers authorize the session first."""
    events = Event.objects.filter(session_id=session_id, seq__gt=after)
    if job is not None:
        written = Message.objects.filter(job_id=job).values("pk")
        events = events.alias(message=KT("payload__id")).filter(
            Q(payload__job=job) | Q(type=MESSAGE_CREATED, message__in=written))
    events = events.order_by("seq")[:limit]
    return redact_wires(viewer, session_id, [e.as_wire() for e in with_full_payloads(events)], memo)


def events_after_raw(session_id: str, after: int = 0, limit: int = PAGE) -> list[dict]:
    """A session's events with ``seq > after``, ascending, as logged — NOT redacted: for a caller
    that redacts them per viewer itself (the live fan-out, ``collab.realtime.fanout``). One query, and up to
    two more that give events stored as references their whole payload back (``with_full_payloads``)."""
    events = Event.objects.filter(session_id=session_id, seq__gt=after).order_by("seq")[:limit]
    return [e.as_wire() for e in with_full_payloads(events)]


def event_seqs(session_ids) -> dict[str, int]:
    """Each session's event counter (``last_event_seq``): it grows with every event written
    there. The embedded relay (``collab.realtime.relay``) and the wait in a thread
    (``collab.realtime.changes``) watch it when there is no shared channel layer."""
    return dict(Session.objects.filter(pk__in=list(session_ids)).values_list("pk", "last_event_seq"))
