"""``list_agents`` (docs/contract.md#list_agents): who an agent can talk to, in a constant number of queries."""

from django.db.models import Count, Q
from django.db.models.functions import Right

from collab.access import visible_sessions
from collab.models import ACTIVE_STATUSES, Branch, Job, Session

PREVIEW_CHARS = 120


def size_label(chars: int) -> str:
    return "<1k chars" if chars < 1000 else f"~{round(chars / 1000)}k chars"


def _busy_branches(branch_ids) -> set[str]:
    return set(Job.objects.running().filter(branch_id__in=branch_ids).values_list("branch_id", flat=True))


def branch_rows(session_ids, *, archived: bool, agent_id: str | None = None, limit: int = 20, previews: bool = True,
                internal: bool = True):
    """Branches of the given sessions (one query) with busy flags (one query).
    ``internal=False`` leaves out internal branches (agents' listings)."""
    qs = Branch.objects.filter(session_id__in=session_ids, archived=archived, tip__isnull=False).select_related(
        "agent_spec"
    )
    if not internal:
        qs = qs.filter(internal=False)
    if agent_id:
        qs = qs.filter(agent_spec__agent_id=agent_id)
    if previews:
        qs = qs.annotate(preview=Right("tip__text", PREVIEW_CHARS))
    rows = list(qs.order_by("-last_active_at")[:limit])
    busy = _busy_branches([b.pk for b in rows])
    for b in rows:
        b.busy = b.pk in busy
    return rows


def list_agents(user, session: Session, *, scope: str = "session", limit: int = 20, agent_id=None, source=None) -> dict:
    """Rows grouped by session. ``session`` and ``archived`` scopes cover the current session;
    ``all`` covers every session of the current session's project (agents stay in their project,
    whatever else ``user`` may see), most recently active first, without previews.
    ``source`` narrows ``all`` to one session id. Only sessions ``user`` may see are listed
    (filtered in the query), so nothing is listed once ``user`` has lost the project.
    Internal branches are never listed, in any scope (they are hidden from agents)."""
    limit = max(1, min(int(limit or 20), 200))
    in_project = visible_sessions(user).filter(project_id=session.project_id)
    if scope == "all":
        sessions_qs = in_project
        if source:
            sessions_qs = sessions_qs.filter(pk=source)
        else:  # sub-agents' sessions are listed by their parents, not at the top level
            sessions_qs = sessions_qs.filter(parent_session__isnull=True)
        sessions = list(
            sessions_qs.select_related("agent_spec")
            .annotate(active=Count("jobs", filter=Q(jobs__status__in=ACTIVE_STATUSES)))
            .order_by("-last_active_at")[:limit]
        )
        rows = branch_rows([s.pk for s in sessions], archived=False, agent_id=agent_id, limit=limit * 10, previews=False,
                           internal=False)
    else:
        sessions = list(
            in_project.filter(pk=session.pk).select_related("agent_spec")
            .annotate(active=Count("jobs", filter=Q(jobs__status__in=ACTIVE_STATUSES)))
        )
        rows = branch_rows([session.pk], archived=(scope == "archived"), agent_id=agent_id, limit=limit, internal=False)
    by_session: dict[str, list] = {}
    for b in rows:
        by_session.setdefault(b.session_id, []).append(b)
    groups = []
    for s in sessions:
        branches = by_session.get(s.pk, [])
        if scope == "all" and not branches:
            continue
        groups.append({"session": s, "busy": s.active > 0, "branches": branches})
    return {"scope": scope, "groups": groups}


def render_agents(listing: dict) -> tuple[str, dict]:
    """The model-facing text and the structured details of a listing."""
    lines, details = [], []
    for group in listing["groups"]:
        s = group["session"]
        agent = s.agent_spec.agent_id if s.agent_spec_id else "-"
        lines.append(f"session {s.pk} \u00b7 {s.title or '(untitled)'} \u00b7 agent {agent} \u00b7 {'busy' if group['busy'] else 'idle'}")
        rows = []
        for b in group["branches"]:
            line = f'  - {b.display_name}  to="{b.address}"  \u2014 {b.turns} turns, {size_label(b.chars)}'
            if b.busy:
                line += "  [busy]"
            preview = getattr(b, "preview", None)
            if preview:
                line += "  \u2026" + " ".join(preview.split())[-80:]
            lines.append(line)
            rows.append({"name": b.display_name, "address": b.address, "turns": b.turns, "chars": b.chars,
                         "busy": b.busy, "archived": b.archived, "archive_reason": b.archive_reason or None})
        details.append({"session_id": s.pk, "title": s.title, "agent_id": None if agent == "-" else agent,
                        "busy": group["busy"], "branches": rows})
    if not lines:
        lines.append("no agents" + (" archived" if listing["scope"] == "archived" else "") + " found")
    return "\n".join(lines), {"scope": listing["scope"], "sessions": details}
