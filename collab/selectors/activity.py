"""The session page's activity feed: the event log told in sentences
(docs/web-app.md#audit-and-activity-in-sentences).

One line per turn ("alice asked *assistant* on *main* — succeeded in 3.2 s, 1,234 tokens"), its
steps folded beneath it, where there was a line per state change; one line per other event
("alice archived branch *review*: done"), its raw payload folded for developers. Streaming chunks
(``message.delta``) are never listed. Pages of ``PAGE_SIZE`` rows, newest first, keyed by
``seq``: a constant number of queries per page, however long the log.

Paging keeps the live refresh honest: "older" asks for one more page (``pages``), so the
panel re-rendered on the next event still shows everything the viewer had opened, as one
consistent snapshot (no gap, no duplicate). Past ``MAX_PAGES`` the link jumps instead
(``before``: the rows older than that seq, a part of the log that no longer changes).
"""

import json
from dataclasses import dataclass

from django.db.models import Q
from django.utils import timezone

from collab.errors import Invalid
from collab.models import Event, Session
from collab.selectors.redact import redact_events, redact_jobs
from collab.selectors.sentences import (
    event_sentence,
    names_for,
    redact_free_text,
    turn_details,
    turn_jobs,
    turn_sentence,
    visible_jobs_q,
)

PAGE_SIZE = 25
MAX_PAGES = 20
NOT_LISTED = ("message.delta",)
# told by their turn's line (``turn_sentence``), not listed on their own
FOLDED = ("job.running", "job.stopping", "job.waiting", "job.succeeded", "job.failed", "job.cancelled",
          "job.interrupted", "message.created")


@dataclass
class ActivityRow:
    seq: int
    type: str
    sentence: str
    created_at: object
    payload_json: str


@dataclass
class ActivityPage:
    rows: list[ActivityRow]
    older: int | None  # the seq the next (older) rows start below; None when this is the oldest
    pages: int = 1
    before: int | None = None

    @property
    def query(self) -> str:
        """The query string that renders this same view again (the live refresh's)."""
        parts = [f"before={self.before}"] if self.before else []
        parts += [f"pages={self.pages}"] if self.pages > 1 else []
        return "?" + "&".join(parts) if parts else ""

    @property
    def older_query(self) -> str:
        """One more page, or past MAX_PAGES a jump to the rows below."""
        if self.pages < MAX_PAGES:
            return ActivityPage([], None, self.pages + 1, self.before).query
        return f"?before={self.older}"


def _positive(name: str, value: str | None, *, maximum: int | None = None) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except ValueError:
        raise Invalid(f"{name} must be a whole number", code=f"invalid_{name}") from None
    if number < 1 or (maximum is not None and number > maximum):
        raise Invalid(f"{name} must be between 1 and {maximum or 'any seq'}", code=f"invalid_{name}")
    return number


def paging(query) -> dict:
    """``before`` (an event seq) and ``pages`` (1..MAX_PAGES) from a query dict; 400 on bad values."""
    return {"before": _positive("before", query.get("before")),
            "pages": _positive("pages", query.get("pages"), maximum=MAX_PAGES) or 1}


def activity_page(session: Session, viewer, before: int | None = None, pages: int = 1) -> ActivityPage:
    """``pages`` pages of the session's activity older than ``before`` (newest first), in sentences:
    one line per turn (``turn_sentence``: who asked which agent, how it ended, how long, its
    tokens; its steps folded) at the place it was asked, one per other event (``event_sentence``).
    A field naming another session ``viewer`` may not see is blanked (``collab.selectors.redact``:
    an agent spawned into it keeps its id and branch name out of the feed), and so is such a
    session named in free text. A constant number of queries, however long the log."""
    events = _lines(session).select_related("actor").order_by("-seq")
    if before is not None:
        events = events.filter(seq__lt=before)
    limit = pages * PAGE_SIZE
    events = list(events[: limit + 1])
    older = events[limit - 1].seq if len(events) > limit else None
    events = events[:limit]

    # A field naming a session ``viewer`` may not see is blanked (with the name and
    # preview that describe it) before the sentence or the developer panel is written.
    wires = redact_events(viewer, session.pk, events)
    payloads = redact_free_text(viewer, [w["payload"] if isinstance(w.get("payload"), dict) else {} for w in wires],
                                own=session.pk)
    turn_ids = {p.get("job") for e, p in zip(events, payloads) if _is_turn(e) and isinstance(p.get("job"), str)}
    turns = redact_jobs(viewer, list(turn_jobs(pk__in=turn_ids).filter(visible_jobs_q(session))), own=session.pk) \
        if turn_ids else []
    names = names_for(((e.session_id, p) for e, p in zip(events, payloads)), here=session.pk, jobs=turns)
    turns = {job.pk: job for job in turns}
    now = timezone.now()
    rows = []
    for e, p in zip(events, payloads):
        job = turns.get(p.get("job")) if _is_turn(e) and isinstance(p.get("job"), str) else None
        if job is not None:
            rows.append(ActivityRow(seq=e.seq, type="turn", sentence=turn_sentence(job, here=session.pk, now=now),
                                    created_at=e.created_at, payload_json=turn_details(job)))
            continue
        actor = e.actor.username if e.actor_id and e.actor else None
        rows.append(ActivityRow(
            seq=e.seq, type=e.type, created_at=e.created_at,
            sentence=event_sentence(e.type, p, actor=actor, session=e.session_id, names=names),
            payload_json=json.dumps(_developer_detail(e.type, p), indent=2, ensure_ascii=False, sort_keys=True, default=str),
        ))
    return ActivityPage(rows=rows, older=older, pages=pages, before=before)


def _lines(session: Session):
    """The events that make a line of the feed: all but the streamed chunks and what a turn's line
    tells (its later state changes and the messages it wrote): a turn is listed once, at its
    ``job.queued`` — an OpenWork child's at its ``child.job`` of that state."""
    return (session.events.exclude(type__in=NOT_LISTED + FOLDED)
            .filter(~Q(type="child.job") | Q(payload__state="job.queued")))


def _is_turn(event: Event) -> bool:
    return event.type in ("job.queued", "child.job")


def _developer_detail(type: str, payload: dict) -> dict:
    """What the developer panel shows of an event: its payload, except a message's text and tool
    calls, which the transcript shows (as cards, redacted per viewer): the panel says their size."""
    if type != "message.created":
        return payload
    detail = {k: v for k, v in payload.items() if k not in ("text", "tool_calls")}
    detail["text_chars"] = len(payload.get("text") or "")
    if payload.get("tool_calls"):
        detail["tool_calls"] = [c.get("name") for c in payload["tool_calls"] if isinstance(c, dict)]
    return detail
