"""The project audit log (docs/contract.md#events): filterable, paginated, exportable."""

from datetime import datetime

from django.utils.dateparse import parse_datetime

from django.db.models import Q

from collab.access import visible_session_ids
from collab.events import with_full_payloads
from collab.errors import Invalid
from collab.models import Event

PAGE_SIZE = 100


def _when(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:  # well formed but not a date, e.g. month 13
        parsed = None
    if parsed is None:
        raise Invalid(f"{name} must be an ISO date-time, e.g. 2026-11-29T12:00:00Z", code="invalid_filter")
    return parsed


def project_events(project, *, viewer, session: str = "", type: str = "", actor: str = "", since: str = "",
                   until: str = ""):
    """Events of the project (sessions and project-level), newest first; events of sessions
    ``viewer`` may not see are left out, in the query. Callers authorize the project."""
    qs = (
        Event.objects.filter(project=project)
        .filter(Q(session__isnull=True) | Q(session_id__in=visible_session_ids(viewer)))
        .select_related("actor").order_by("-created_at", "-id")
    )
    if session:
        qs = qs.filter(session_id=session)
    if type:
        qs = qs.filter(type__startswith=type) if type.endswith(".") else qs.filter(type=type)
    if actor:
        qs = qs.filter(actor__username=actor)
    if (start := _when(since, "since")) is not None:
        qs = qs.filter(created_at__gte=start)
    if (end := _when(until, "until")) is not None:
        qs = qs.filter(created_at__lt=end)
    return qs


def audit_rows(events) -> list:
    """A page of ``project_events`` ready to show: events stored as references given their whole
    payload back (``collab.events.with_full_payloads``; a query for messages, one for jobs)."""
    return with_full_payloads(events)


def event_records(events, chunk: int = 500):
    """``project_events`` as ``event_record`` dicts, streamed ``chunk`` rows at a time (one query
    per chunk for the rows, and for its events' messages and jobs: ``with_full_payloads``)."""
    batch = []
    for event in events.iterator(chunk_size=chunk):
        batch.append(event)
        if len(batch) == chunk:
            yield from map(event_record, with_full_payloads(batch))
            batch = []
    yield from map(event_record, with_full_payloads(batch))


def event_record(event: Event) -> dict:
    return {
        "id": event.pk, "session": event.session_id, "seq": event.seq, "type": event.type,
        "actor": event.actor.username if event.actor_id else None, "payload": event.payload,
        "created_at": event.created_at.isoformat(),
    }
