"""The session page's activity feed: the event log told in sentences.

Each row says what happened in words a person reads ("alice started a turn on main",
"researcher finished in 3.2 s", "branch X archived: reason"); the raw event (type, seq,
payload) rides along for the collapsible developer panel. Streaming chunks
(``message.delta``) are never listed. Pages of ``PAGE_SIZE`` rows, newest first, keyed by
``seq``: a constant number of queries per page, however long the log.

Paging keeps the live refresh honest: "older" asks for one more page (``pages``), so the
panel re-rendered on the next event still shows everything the viewer had opened, as one
consistent snapshot (no gap, no duplicate). Past ``MAX_PAGES`` the link jumps instead
(``before``: the rows older than that seq, a part of the log that no longer changes).
"""

import json
from dataclasses import dataclass

from collab.selectors.redact import redact_events
from collab.errors import Invalid
from collab.models import Branch, Event, Job, Session

PAGE_SIZE = 25
MAX_PAGES = 20
NOT_LISTED = ("message.delta",)


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
    """``pages`` pages of the session's events older than ``before`` (newest first), in sentences; a
    field naming another session ``viewer`` may not see is blanked (``collab.selectors.redact``:
    an agent spawned into it keeps its id and branch name out of the feed). A constant number of
    queries, however long the log."""
    events = session.events.exclude(type__in=NOT_LISTED).select_related("actor").order_by("-seq")
    if before is not None:
        events = events.filter(seq__lt=before)
    limit = pages * PAGE_SIZE
    events = list(events[: limit + 1])
    older = events[limit - 1].seq if len(events) > limit else None
    events = events[:limit]

    # A field naming a session ``viewer`` may not see is blanked (with the name and
    # preview that describe it) before the sentence or the developer panel is written.
    wires = redact_events(viewer, session.pk, events)
    kept = [(e, w["payload"] if isinstance(w.get("payload"), dict) else {}) for e, w in zip(events, wires)]

    branch_ids = {p.get(k) for _, p in kept for k in ("branch", "target_branch")} - {None}
    job_ids = {p.get("job") for _, p in kept} - {None}
    names = dict(Branch.objects.filter(session=session, pk__in=branch_ids).values_list("pk", "name")) if branch_ids else {}
    jobs = (
        {j.pk: j for j in Job.objects.filter(session=session, pk__in=job_ids).select_related("branch")}
        if job_ids else {}
    )
    words = _Words(names, jobs)
    rows = [
        ActivityRow(
            seq=e.seq, type=e.type, sentence=words.sentence(e, p), created_at=e.created_at,
            payload_json=json.dumps(_developer_detail(e.type, p), indent=2, ensure_ascii=False, sort_keys=True, default=str),
        )
        for e, p in kept
    ]
    return ActivityPage(rows=rows, older=older, pages=pages, before=before)


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


def _seconds(job: Job | None) -> str:
    if job is None or not job.started_at or not job.finished_at:
        return ""
    return f"{(job.finished_at - job.started_at).total_seconds():.1f} s"


JOB_NOUNS = {"user": "a turn", "spawn": "a spawned agent", "task": "a task", "message": "a message", "followup": "a result"}


class _Words:
    """Turns one event into a sentence, with branch names and job rows looked up in bulk."""

    def __init__(self, names: dict, jobs: dict):
        self.names = names
        self.jobs = jobs

    def branch(self, branch_id, fallback: str = "a branch") -> str:
        if branch_id in self.names:
            return self.names[branch_id] or branch_id[:8]
        return fallback

    def agent(self, p: dict) -> str:
        job = self.jobs.get(p.get("job"))
        if job is not None:
            return job.branch.display_name
        return self.branch(p.get("branch"), "an agent")

    def sentence(self, event: Event, p: dict) -> str:
        who = event.actor.username if event.actor_id and event.actor else None
        t = event.type
        job = self.jobs.get(p.get("job"))
        took = _seconds(job)
        if t == "session.created":
            return f"{who or 'someone'} created the session" + (f" “{p['title']}”" if p.get("title") else "")
        if t == "branch.created":
            name = p.get("name") or self.branch(p.get("branch"))
            return f"branch {name} forked" if p.get("forked_from") else f"branch {name} opened"
        if t == "branch.renamed":
            return f"branch {p.get('old') or 'unnamed'} renamed to {p.get('name')}"
        if t == "branch.archived":
            how = " automatically" if p.get("automatic") else ""
            name = p.get("name") or self.branch(p.get("branch"))
            return f"branch {name} archived{how}" + (f": {p['reason']}" if p.get("reason") else "")
        if t == "branch.internal_changed":
            return f"branch {self.branch(p.get('branch'))} " + ("marked internal" if p.get("internal") else "no longer internal")
        if t == "message.created":
            where = self.branch(p.get("branch"))
            role, kind = p.get("role"), p.get("kind")
            if role == "user" and kind in (None, "", "normal"):
                return f"{who or 'someone'} wrote on {where}"
            if role == "assistant":
                return f"{where} answered" if not p.get("tool_calls") else f"{where} called tools"
            if role == "tool":
                return f"{where} got a tool result"
            return f"{(kind or role or 'a message').replace('_', ' ')} arrived on {where}"
        if t == "job.queued":
            where = self.branch(p.get("branch"))
            if p.get("kind") == "user":
                return f"{who or 'someone'} started a turn on {where}"
            return f"{JOB_NOUNS.get(p.get('kind'), 'a turn')} queued on {where}"
        if t == "job.running":
            return f"{self.agent(p)} started working"
        if t == "job.stopping":
            return f"{self.agent(p)} is stopping"
        if t == "job.succeeded":
            return f"{self.agent(p)} finished" + (f" in {took}" if took else "")
        if t == "job.failed":
            return f"{self.agent(p)} failed" + (f" after {took}" if took else "") + (f": {p['error_code']}" if p.get("error_code") else "")
        if t == "job.cancelled":
            return f"{self.agent(p)} was stopped" + (f" after {took}" if took else "")
        if t == "job.interrupted":
            return f"{self.agent(p)} was interrupted (its worker went away)"
        if t == "execution.cancel_requested":
            return f"{who or 'someone'} asked {self.agent(p)} to stop" + (" (and its sub-agents)" if p.get("cascaded") else "")
        if t == "agent.spawned":
            name = p.get("task_name") or p.get("name") or "an agent"
            return f"agent {name} spawned" + (" in the background" if p.get("background") else "")
        if t == "agent.interrupted":
            return f"{who or 'someone'} interrupted agent {p.get('task_name') or ''}".rstrip()
        if t == "agents.listed":
            return f"{p.get('by') or 'an agent'} listed the agents ({p.get('scope') or 'all'})"
        if t == "child.job":
            state = str(p.get("state") or "").removeprefix("job.")
            return f"a sub-agent's turn is {state}" if state else "a sub-agent's turn changed"
        if t in ("delivery.sent", "delivery.received"):
            verb = "sent" if t == "delivery.sent" else "received"
            return f"{p.get('kind') or 'message'} {verb}: {p.get('from') or '?'} → {p.get('to') or '?'}"
        if t == "delivery.held":
            return f"a {p.get('kind') or 'delivery'} to {p.get('to') or '?'} waits for confirmation"
        if t == "delivery.approved":
            return f"{p.get('by') or who or 'someone'} approved a held delivery"
        if t == "delivery.rejected":
            if p.get("by"):
                return f"{p['by']} rejected a held delivery"
            return f"a delivery to {self.branch(p.get('target_branch'))} was refused ({p.get('code') or 'rejected'})"
        if t == "delivery.started":
            return f"a queued message to {p.get('to') or '?'} started a turn"
        if t == "inbox.queued":
            return f"a message from {p.get('from') or '?'} waits in {self.branch(p.get('target_branch'))}'s inbox"
        if t == "inbox.drained":
            return f"{self.branch(p.get('branch'))}'s inbox was delivered"
        if t == "inbox.dropped":
            return f"a message to {p.get('target') or '?'} was dropped" + (f": {p['reason']}" if p.get("reason") else "")
        if t == "followup.noticed":
            return "a result is owed to its caller"
        if t == "followup.drained":
            return "a result was delivered to its caller"
        if t == "followup.undeliverable":
            return "a result could not be delivered" + (f": {p['reason']}" if p.get("reason") else "")
        if t == "todo.created":
            return f"{who or 'an agent'} added a to-do: {p.get('subject') or ''}".rstrip(": ")
        if t == "todo.updated":
            return f"a to-do is now {p.get('status') or 'updated'}"
        if t == "session.visibility_changed":
            return f"{who or 'someone'} made the session {p.get('to')}"
        if t == "session.shared":
            return f"{who or 'someone'} shared the session with {p.get('username')} ({p.get('role')})"
        if t == "session.unshared":
            return f"{who or 'someone'} stopped sharing the session with {p.get('username')}"
        if t == "model.retry":
            return (f"{self.agent(p)}'s model call is retried ({p.get('attempt')}/{p.get('max_retries')})"
                    + (f": {p['reason']}" if p.get("reason") else ""))
        return t.replace(".", " ").replace("_", " ")
