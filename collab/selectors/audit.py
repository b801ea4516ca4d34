"""The project audit log (docs/contract.md#events): filterable, paginated, exportable; shown in
sentences (docs/web-app.md#audit-and-activity-in-sentences)."""

import json
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q
from django.utils.dateparse import parse_datetime

from collab.access import visible_session_ids
from collab.errors import Invalid
from collab.events import with_full_payloads
from collab.models import Event
from collab.selectors.redact import redact_wires
from collab.selectors.sentences import event_sentence, names_for, redact_free_text

PAGE_SIZE = 100

# What the audit page shows unless asked for every event: who may do what (members, roles,
# invitations, tokens), who sees what (sessions opened, visibility, shares, internal branches), how
# the project is set up (settings, limits, workspace, agent specs, webhooks) and the acts that stop
# or end work or hold it for a person (cancels and interrupts, archives, held deliveries and tool
# calls approved or rejected).
# Turns, messages, deliveries and the like are the sessions' own story: "show every event".
ADMIN_EVENT_TYPES = (
    "member.invited", "member.accepted", "member.declined", "member.role_changed", "member.removed",
    "member.invitation_cancelled",
    "token.created", "token.revoked",
    "session.created", "session.visibility_changed", "session.shared", "session.unshared", "branch.internal_changed",
    "project.updated", "limits.changed", "workspace.changed",
    "agent_spec.created", "agent_spec.changed", "agent_spec.deleted",
    "webhook.created", "webhook.updated", "webhook.deleted", "webhook.secret_rotated",
    "execution.cancel_requested", "agent.interrupted", "branch.archived",
    "delivery.held", "delivery.approved", "delivery.rejected", "approval.decided",
)


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
                   until: str = "", admin_only: bool = False):
    """Events of the project (sessions and project-level), newest first; events of sessions
    ``viewer`` may not see are left out, in the query. ``admin_only``: only ``ADMIN_EVENT_TYPES``,
    unless a ``type`` is asked for. Callers authorize the project."""
    qs = (
        Event.objects.filter(project=project)
        .filter(Q(session__isnull=True) | Q(session_id__in=visible_session_ids(viewer)))
        .select_related("actor").order_by("-created_at", "-id")
    )
    if session:
        qs = qs.filter(session_id=session)
    if type:
        qs = qs.filter(type__startswith=type) if type.endswith(".") else qs.filter(type=type)
    elif admin_only:
        qs = qs.filter(type__in=ADMIN_EVENT_TYPES)
    if actor:
        qs = qs.filter(actor__username=actor)
    if (start := _when(since, "since")) is not None:
        qs = qs.filter(created_at__gte=start)
    if (end := _when(until, "until")) is not None:
        qs = qs.filter(created_at__lt=end)
    return qs


@dataclass
class AuditRow:
    event: Event
    sentence: str  # HTML: ``collab.selectors.sentences.event_sentence``
    detail: str  # the payload as the reader may see it, as indented JSON


def audit_rows(events, *, viewer, project) -> list[AuditRow]:
    """A page of ``project_events`` ready to show: each event in a sentence, with its payload as
    JSON beside it. Events stored as references get their whole payload back
    (``collab.events.with_full_payloads``); what names a session ``viewer`` may not see is blanked
    (``redact_wires``) and its id or title in free text reads "another session"
    (``redact_free_text``); the rows the sentences name are read in bulk (``names_for``). A
    bounded number of queries, however many sessions the page spans."""
    events = with_full_payloads(events)
    wires = redact_wires(viewer, None, [e.as_wire() for e in events])
    payloads = redact_free_text(viewer, [w["payload"] if isinstance(w.get("payload"), dict) else {"payload": w.get("payload")}
                                         for w in wires])
    names = names_for(((e.session_id, p) for e, p in zip(events, payloads)), project=project.slug)
    return [
        AuditRow(event=e, detail=json.dumps(p, indent=2, ensure_ascii=False, sort_keys=True, default=str),
                 sentence=event_sentence(e.type, p, actor=e.actor.username if e.actor_id and e.actor else None,
                                         session=e.session_id, names=names))
        for e, p in zip(events, payloads)
    ]


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
