"""Events told as short sentences with links (docs/web-app.md#audit-and-activity-in-sentences).

``event_sentence`` is the one function that turns a logged event into words a person reads —
"alice archived branch *review* in session *Plan launch*", "job 3f2a9c… cancelled by bob
(cascade: 2 children)" — for every event type of docs/contract.md#events and the project-level
ones (members, limits, tokens, specs, webhooks); a type it does not know reads as its
``key: value`` pairs, values written as JSON. ``turn_sentence`` tells one turn (a job) in a line:
who asked which agent, how it ended, how long it took, its tokens.

Both return HTML (``SafeString``): every value from a payload is escaped, names become links to the
session or branch they name. Callers hand in payloads already redacted for the reader
(``collab.selectors.redact``: references to sessions they may not see set to ``None``) and pass
the free text through ``redact_free_text``; ``names_for`` looks up, in bulk, the rows the
sentences name (at most three queries, however many events).
"""

import json
from dataclasses import dataclass, field

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from collab.models import Branch, Job, Session
from collab.selectors.redact import redact_texts

# payload keys that hold references (ids, addresses, lists of ids): redacted per reader by
# ``collab.selectors.redact.redact_wires``; every other string in a payload is free text
REFERENCE_KEYS = frozenset({
    "id", "session", "branch", "target_branch", "predecessor", "job", "into", "caller_job", "parent_job", "jobs",
    "attach", "forked_from", "start_from", "from", "to", "target", "address", "entry", "inbox_entry", "hold",
    "todo", "webhook", "token", "session_ids", "cascaded", "command_id", "minted_by",
})
BRANCH_KEYS = ("branch", "target_branch")
JOB_KEYS = ("job", "into", "caller_job")

JOB_NOUNS = {"user": "a turn", "spawn": "a spawned agent's turn", "task": "a task", "message": "a message",
             "followup": "a result's turn"}
JOB_STATES = {
    "queued": "was queued", "running": "started running", "stopping": "is stopping", "succeeded": "succeeded",
    "failed": "failed", "cancelled": "was cancelled", "interrupted": "was interrupted (its worker went away)",
    "waiting": "waits for a person",
}
MESSAGE_KINDS = {
    "agent_spawn": "a spawned agent's prompt", "agent_message": "an agent's message", "task": "a task",
    "message": "a message", "followup": "a result", "notice": "a notice", "attach": "a link to a spawned agent",
}
VISIBILITY_WORDS = {
    "project": "every member of the project",
    "private": "only its creator, maintainers and owners",
    "shared": "only its creator, the people it is shared with, maintainers and owners",
}
SHORT_ID = 6  # characters of an id shown in a sentence (the whole id is in the link's title)


@dataclass
class Names:
    """The rows the sentences of a batch of events name, read once (``names_for``).

    ``here``: the session whose page the sentences are read on (not named again); ``project``:
    the project slug (links to its agent specs)."""

    branches: dict = field(default_factory=dict)  # id -> (session id, name)
    jobs: dict = field(default_factory=dict)  # id -> Job (with its branch)
    sessions: dict = field(default_factory=dict)  # id -> title
    here: str | None = None
    project: str | None = None


def names_for(items, *, here: str | None = None, project: str | None = None, jobs=None) -> Names:
    """``Names`` for ``items``, pairs of (session id, payload) as the reader may see them: the
    branches, jobs and sessions they name, in at most three queries (none for a kind nobody names).
    ``jobs``: Job rows read already (``turn_sentence``'s), kept and not read again."""
    items = list(items)
    known = {j.pk: j for j in (jobs or ())}
    branch_ids = {_key(p.get(k)) for _, p in items for k in BRANCH_KEYS} - {None}
    job_ids = {_key(p.get(k)) for _, p in items for k in JOB_KEYS} - {None} - set(known)
    session_ids = {sid for sid, _ in items} | {_key(p.get("session")) for _, p in items}
    names = Names(here=here, project=project, jobs=known)
    if branch_ids:
        names.branches = {pk: (sid, name) for pk, sid, name in
                          Branch.objects.filter(pk__in=branch_ids).values_list("pk", "session_id", "name")}
    if job_ids:
        names.jobs.update({j.pk: j for j in Job.objects.filter(pk__in=job_ids).select_related("branch")
                           .only("pk", "session_id", "branch", "branch__name", "branch__session_id", "kind",
                                 "status", "started_at", "finished_at")})
    session_ids |= {j.session_id for j in names.jobs.values()}
    session_ids = {s for s in session_ids if isinstance(s, str) and s != here}
    if session_ids:
        names.sessions = dict(Session.objects.filter(pk__in=session_ids).values_list("pk", "title"))
    return names


def redact_free_text(viewer, payloads: list[dict], *, own: str | None = None) -> list[dict]:
    """``payloads`` with their free text (every value but the references, ``REFERENCE_KEYS``) as
    ``viewer`` may read it: a hidden session's id, title or branch names inside a reason, a title or
    a preview read ``another session`` (``redact_texts``: no query unless a text holds an id)."""
    free = [{k: v for k, v in p.items() if k not in REFERENCE_KEYS} for p in payloads]
    scrubbed, hidden = redact_texts(viewer, free, own=own)
    if not hidden:
        return payloads
    return [{**p, **s} for p, s in zip(payloads, scrubbed)]


# --- pieces -----------------------------------------------------------------------------------


def _text(value) -> str:
    """A payload value as words: a string as it is, anything else as JSON (never Python's repr)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _key(value) -> str | None:
    """A payload value used to look something up: a string, else nothing (never a TypeError)."""
    return value if isinstance(value, str) else None


def _quote(value) -> SafeString:
    return format_html("“{}”", _text(value))


def short(id_value) -> str:
    text = _text(id_value)
    return text[:SHORT_ID] + "…" if len(text) > SHORT_ID + 1 else text


def session_url(sid: str, branch: str | None = None) -> str:
    url = reverse("collab:session", args=[sid])
    return f"{url}?branch={branch}" if branch else url


class _Say:
    """The words of one batch: links to what ``names`` knows, plain words for the rest."""

    def __init__(self, names: Names):
        self.names = names

    def session(self, sid) -> SafeString:
        if not isinstance(sid, str):
            return mark_safe("another session")
        if sid == self.names.here:
            return mark_safe("this session")
        title = self.names.sessions.get(sid)
        if title is None and sid not in self.names.sessions:
            return format_html("session <code>{}</code>", short(sid))
        return format_html('session <a href="{}" title="{}">{}</a>', session_url(sid), sid, title or short(sid))

    def where(self, sid) -> SafeString:
        """" in session X" — nothing on that session's own page, nor for a project-level event."""
        if sid is None or sid == self.names.here:
            return mark_safe("")
        return format_html(" in {}", self.session(sid))

    def branch(self, bid, name=None) -> SafeString:
        """The branch, linked where the batch read it; ``name``: what the payload calls it."""
        known = self.names.branches.get(bid) if isinstance(bid, str) else None
        label = name or (known[1] if known else None) or (short(bid) if isinstance(bid, str) else None)
        if label is None:
            return mark_safe("a branch")
        if known is None:
            return format_html("<em>{}</em>", _text(label))
        return format_html('<a href="{}">{}</a>', session_url(known[0], bid), _text(label))

    def job(self, jid) -> SafeString:
        if not isinstance(jid, str):
            return mark_safe("a job")
        job = self.names.jobs.get(jid)
        if job is None:
            return format_html('job <code title="{}">{}</code>', jid, short(jid))
        return format_html('job <a href="{}" title="{}"><code>{}</code></a>', session_url(job.session_id, job.branch_id),
                           jid, short(jid))

    def job_branch(self, jid) -> SafeString:
        """" on branch X" for a job the batch read."""
        job = self.names.jobs.get(jid) if isinstance(jid, str) else None
        if job is None:
            return mark_safe("")
        return format_html(' on branch <a href="{}">{}</a>', session_url(job.session_id, job.branch_id),
                           job.branch.display_name)

    def address(self, address) -> SafeString:
        """A ``SID:MID`` address: its session, linked to the node; another session's when blanked."""
        if not isinstance(address, str) or not address:
            return mark_safe("another session")
        sid, _, mid = address.partition(":")
        if sid == self.names.here or sid in self.names.sessions:
            where = "this session" if sid == self.names.here else (self.names.sessions.get(sid) or short(sid))
            return format_html('<a href="{}{}">{}</a>', session_url(sid), f"?head={mid}" if mid else "", where)
        return format_html("<code>{}</code>", short(address))


def _who(actor: str | None, fallback: str = "someone") -> SafeString:
    return format_html("{}", actor or fallback)


def _reason(p: dict, key: str = "reason") -> SafeString:
    return format_html(": {}", _text(p[key])) if p.get(key) else mark_safe("")


def _count(n, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _changes(changes) -> SafeString:
    """``{field: {"from": a, "to": b}}`` (limits) or ``{field: value}`` as "field a → b" pairs."""
    if not isinstance(changes, dict) or not changes:
        return mark_safe("nothing")
    parts = []
    for key, value in changes.items():
        if isinstance(value, dict) and set(value) == {"from", "to"}:
            parts.append((key, _setting(value["from"]), _setting(value["to"])))
        else:
            parts.append((key, None, _setting(value)))
    return format_html_join(", ", "{} {}", (
        (name.replace("_", " "), format_html("{} → {}", before, after) if before is not None else format_html("→ {}", after))
        for name, before, after in parts))


def _setting(value) -> str:
    return "default" if value is None else _text(value)


def _pairs(payload: dict) -> SafeString:
    """The fallback: ``key: value`` pairs, values as JSON."""
    if not payload:
        return mark_safe("")
    return format_html(" — {}", format_html_join(", ", "{}: {}", ((k, _text(v)) for k, v in payload.items())))


# --- one event ----------------------------------------------------------------------------------


def event_sentence(type: str, payload: dict, *, actor: str | None, session: str | None, names: Names) -> SafeString:
    """The event as a sentence (HTML, every value escaped). ``payload``: as the reader may see it
    (redacted); ``actor``: the person's username, if any; ``session``: the event's session (None
    for a project-level event); ``names``: from ``names_for``."""
    say = _Say(names)
    p = payload if isinstance(payload, dict) else {"payload": payload}
    tell = _TELLERS.get(type)
    if tell is None:
        return format_html("{} <code>{}</code>{}{}", _who(actor), type, say.where(session), _pairs(p))
    return tell(say, p, actor, session)


def _session_created(say, p, actor, sid):
    agent = format_html(" with agent <code>{}</code>", p["agent_id"]) if p.get("agent_id") else mark_safe("")
    if sid is not None and sid == say.names.here:
        return format_html("{} created this session{}", _who(actor), agent)
    title = p.get("title")
    return format_html("{} created {}{}", _who(actor), say.session(sid) if sid else _quote(title), agent)


def _branch_created(say, p, actor, sid):
    who = _who(actor) if not p.get("job") else format_html("an agent ({})", say.job(p["job"]))
    verb = "forked" if p.get("forked_from") else "opened"
    return format_html("{} {} branch {}{}", who, verb, say.branch(p.get("branch"), p.get("name")), say.where(sid))


def _branch_renamed(say, p, actor, sid):
    if not p.get("old"):
        return format_html("{} named branch {}{}", _who(actor) if actor else "the model",
                           say.branch(p.get("branch"), p.get("name")), say.where(sid))
    old = _text(p["old"])
    if actor:
        return format_html("{} renamed branch <em>{}</em> to {}{}", _who(actor), old,
                           say.branch(p.get("branch"), p.get("name")), say.where(sid))
    return format_html("branch <em>{}</em> was named {}{}", old, say.branch(p.get("branch"), p.get("name")),
                       say.where(sid))


def _branch_archived(say, p, actor, sid):
    branch = say.branch(p.get("branch"), p.get("name"))
    again = mark_safe("") if p.get("first", True) else mark_safe(" (it was archived already)")
    if p.get("automatic"):
        return format_html("branch {}{} was archived automatically: its task is done{}", branch, say.where(sid), again)
    return format_html("{} archived branch {}{}{}{}", _who(actor), branch, say.where(sid), _reason(p), again)


def _branch_internal(say, p, actor, sid):
    what = "internal (hidden from agents)" if p.get("internal") else "visible to agents again"
    return format_html("{} marked branch {} {}{}", _who(actor), say.branch(p.get("branch")), what, say.where(sid))


def _message_created(say, p, actor, sid):
    where = say.branch(p.get("branch"))
    role, kind = p.get("role"), p.get("kind")
    if role == "user" and kind in (None, "", "normal"):
        return format_html("{} wrote on {}{}", _who(actor), where, say.where(sid))
    if role == "assistant":
        calls = [c.get("name") for c in p.get("tool_calls") or () if isinstance(c, dict) and c.get("name")]
        if calls:
            return format_html("the agent on {} called {}{}", where, ", ".join(map(_text, calls)), say.where(sid))
        return format_html("the agent on {} answered{}", where, say.where(sid))
    if role == "tool":
        return format_html("a tool result arrived on {}{}", where, say.where(sid))
    what = MESSAGE_KINDS.get(_key(kind)) or _text(kind or role or "a message").replace("_", " ")
    return format_html("{} arrived on {}{}", what, where, say.where(sid))


def _message_delta(say, p, actor, sid):
    return format_html("the model streamed text for {}{}", say.job(p.get("job")), say.where(sid))


def _job_state(say, p, actor, sid, state=None):
    state = state or _text(p.get("status") or "")
    noun = JOB_NOUNS.get(_key(p.get("kind")), "")
    kind = format_html(" ({})", noun) if noun else mark_safe("")
    by = format_html(" by {}", _who(actor)) if actor and state == "queued" else mark_safe("")
    error = format_html(" ({})", p["error_code"]) if p.get("error_code") else mark_safe("")
    took = _took(say.names.jobs.get(_key(p.get("job")))) if state in JOB_STATES and state not in ("queued", "running") else ""
    took = format_html(" {} {}", "in" if state == "succeeded" else "after", took) if took else mark_safe("")
    return format_html("{}{}{} {}{}{}{}{}", say.job(p.get("job")), kind, say.job_branch(p.get("job")),
                       JOB_STATES.get(state, state or "changed"), by, took, error, say.where(sid))


def _child_job(say, p, actor, sid):
    state = _text(p.get("state") or "").removeprefix("job.")
    return format_html("a sub-agent's {} {} ({})", say.job(p.get("job")), JOB_STATES.get(state, state or "changed"),
                       say.session(p.get("session")))


def _agent_spawned(say, p, actor, sid):
    name = p.get("task_name") or p.get("name")
    agent = format_html("agent {}", say.branch(p.get("branch"), name)) if name or p.get("branch") else "an agent"
    elsewhere = (format_html(" into {}", say.session(p.get("session")))
                 if p.get("session") != sid else mark_safe(""))
    background = mark_safe(" in the background") if p.get("background") else mark_safe("")
    return format_html("{} spawned {}{}{}{}", _who(actor, "an agent"), agent, background, elsewhere,
                       say.where(sid))


def _agent_interrupted(say, p, actor, sid):
    return format_html("{} interrupted sub-agent <em>{}</em> ({}){}", _who(actor, "an agent"),
                       _text(p.get("task_name") or "?"), say.job(p.get("job")), say.where(sid))


def _delivery(say, p, actor, sid, verb):
    kind = _text(p.get("kind") or "message")
    target = say.branch(p.get("target_branch")) if p.get("target_branch") else say.address(p.get("to"))
    return format_html("a {} from {} {} {}{}", kind, say.address(p.get("from")), verb, target, say.where(sid))


def _delivery_held(say, p, actor, sid):
    target = say.branch(p.get("target_branch")) if p.get("target_branch") else say.address(p.get("to"))
    preview = format_html(": {}", _quote(p["text_preview"])) if p.get("text_preview") else mark_safe("")
    return format_html("a {} to {} waits for a member's confirmation{}{}", _text(p.get("kind") or "delivery"),
                       target, say.where(sid), preview)


def _delivery_decided(say, p, actor, sid, verb):
    result = format_html(" ({} delivered it)", say.job(p["job"])) if p.get("job") and verb == "approved" else mark_safe("")
    return format_html("{} {} held delivery #{}{}{}", _who(p.get("by") or actor), verb, _text(p.get("hold", "?")),
                       result, say.where(sid))


def _delivery_rejected(say, p, actor, sid):
    if p.get("by") or p.get("hold") is not None:
        return _delivery_decided(say, p, actor, sid, "rejected")
    preview = format_html(": {}", _quote(p["text_preview"])) if p.get("text_preview") else mark_safe("")
    return format_html("a message to {} was refused ({}){}{}", say.branch(p.get("target_branch")),
                       _text(p.get("code") or "rejected"), say.where(sid), preview)


def _delivery_started(say, p, actor, sid):
    return format_html("a queued message to {} started {}{}", say.address(p.get("to")), say.job(p.get("job")),
                       say.where(sid))


def _inbox_queued(say, p, actor, sid):
    return format_html("a message from {} waits in the inbox of {}{}", say.address(p.get("from")),
                       say.branch(p.get("target_branch")), say.where(sid))


def _inbox_drained(say, p, actor, sid):
    jobs = p.get("jobs") if isinstance(p.get("jobs"), list) else []
    return format_html("the inbox of {} was delivered ({}){}", say.branch(p.get("branch")),
                       _count(len(jobs), "turn", "turns"), say.where(sid))


def _inbox_dropped(say, p, actor, sid):
    target = say.branch(p.get("target_branch")) if p.get("target_branch") else say.address(p.get("target"))
    return format_html("a message to {} was dropped{}{}", target, say.where(sid), _reason(p))


def _followup(say, p, actor, sid, what):
    return format_html("the result of {} {}{}{}", say.job(p.get("job")), what, say.where(sid),
                       _reason(p) if what == "could not be delivered" else mark_safe(""))


def _cancel_requested(say, p, actor, sid):
    cascaded = p.get("cascaded") if isinstance(p.get("cascaded"), list) else []
    cascade = format_html(" (cascade: {})", _count(len(cascaded), "child", "children")) if cascaded else mark_safe("")
    via = mark_safe(" from the admin") if p.get("via") == "admin" else mark_safe("")
    return format_html("{}{} cancelled by {}{}{}{}", say.job(p.get("job")), say.job_branch(p.get("job")),
                       _who(actor), via, cascade, say.where(sid))


def _agents_listed(say, p, actor, sid):
    count = p.get("sessions")
    seen = format_html(", {}", _count(count, "session", "sessions")) if isinstance(count, int) else mark_safe("")
    by = format_html("the agent at {}", say.address(p["by"])) if p.get("by") else _who(actor)
    return format_html("{} listed the agents ({}{}){}", by,
                       _text(p.get("scope") or "all"), seen, say.where(sid))


def _todo_created(say, p, actor, sid):
    return format_html("{} added a to-do{}: {}", _who(actor, "an agent"), say.where(sid), _text(p.get("subject") or ""))


def _todo_updated(say, p, actor, sid):
    return format_html("{} marked to-do #{} {}{}", _who(actor, "an agent"), _text(p.get("todo", "?")),
                       _text(p.get("status") or "updated"), say.where(sid))


def _visibility_changed(say, p, actor, sid):
    to = p.get("to")
    words = VISIBILITY_WORDS.get(_key(to)) or _text(to)
    return format_html("{} changed who sees {}: {}", _who(actor), say.session(p.get("session") or sid), words)


def _metadata_changed(say, p, actor, sid):
    keys = p.get("keys") if isinstance(p.get("keys"), list) else []
    named = format_html(" ({})", ", ".join(_text(k) for k in keys)) if keys else mark_safe("")
    return format_html("{} changed the metadata of {}{}", _who(actor), say.session(p.get("session") or sid), named)


def _session_deleted(say, p, actor, sid):
    return format_html("{} deleted session {}", _who(actor), _quote(p.get("title") or short(p.get("session") or "?")))


def _shared(say, p, actor, sid):
    return format_html("{} shared {} with {} ({})", _who(actor), say.session(sid),
                       _text(p.get("username") or "?"), _text(p.get("role") or "viewer"))


def _unshared(say, p, actor, sid):
    return format_html("{} stopped sharing {} with {}", _who(actor), say.session(sid),
                       _text(p.get("username") or "?"))


def _asked(approval: bool):
    def tell(say, p, actor, sid):
        of = format_html(" of {}", _text(p["to"])) if p.get("to") else mark_safe("")
        question = format_html(": {}", _quote(p["question"])) if p.get("question") else mark_safe("")
        if approval:
            return format_html("{} asks{} for approval to call <code>{}</code>{}{}", say.job(p.get("job")), of,
                               _text(p.get("tool") or "?"), say.where(sid), question)
        return format_html("{} asks{} a question{}{}", say.job(p.get("job")), of, say.where(sid), question)
    return tell


def _decided(say, p, actor, sid):
    decision = _text(p.get("decision") or "decided")
    edited = mark_safe(" (arguments edited)") if p.get("edited") else mark_safe("")
    what = (format_html("the call of <code>{}</code> by {}", _text(p["tool"]), say.job(p.get("job"))) if p.get("tool")
            else format_html("the question of {}", say.job(p.get("job"))))
    return format_html("{} {} {}{}{}{}", _who(p.get("by") or actor), decision, what, edited, say.where(sid),
                       _reason(p))


def _ask_closed(say, p, actor, sid):
    return format_html("request #{} of {} closed undecided (its turn {}){}", _text(p.get("ask", "?")),
                       say.job(p.get("job")), _text(p.get("status") or "ended"), say.where(sid))


def _model_retry(say, p, actor, sid):
    return format_html("the model call of {} is tried again ({}/{}){}{}", say.job(p.get("job")),
                       _text(p.get("attempt", "?")), _text(p.get("max_retries", "?")), say.where(sid), _reason(p))


def _member(verb):
    def tell(say, p, actor, sid):
        user, role = _text(p.get("username") or "?"), _text(p.get("role") or "")
        if verb == "invited":
            return format_html("{} invited {} as {}", _who(actor), user, role or "member")
        if verb == "accepted":
            return format_html("{} accepted the invitation ({})", user, role or "member")
        if verb == "declined":
            return format_html("{} declined the invitation", user)
        if verb == "role_changed":
            return format_html("{} made {} {} {}", _who(actor), user,
                               "an" if role[:1] in ("a", "e", "i", "o", "u") else "a", role)
        if verb == "invitation_cancelled":
            return format_html("{} cancelled the invitation of {}", _who(actor), user)
        return format_html("{} removed {} from the project", _who(actor), user)
    return tell


def _limits_changed(say, p, actor, sid):
    return format_html("{} changed the limits: {}", _who(actor), _changes(p.get("changes")))


def _project_updated(say, p, actor, sid):
    return format_html("{} changed the project: {}", _who(actor), _changes(p))


def _workspace_changed(say, p, actor, sid):
    if not p.get("to"):
        return format_html("{} cleared the project's workspace", _who(actor, "an operator"))
    return format_html("{} pointed the project's workspace at <code>{}</code>", _who(actor, "an operator"),
                       _text(p["to"]))


def _token(verb):
    def tell(say, p, actor, sid):
        name = format_html("token {}", _quote(p["name"])) if p.get("name") else mark_safe("an unnamed token")
        user = _text(p.get("user") or "?")
        if verb == "revoked":
            return format_html("{} revoked {} of {}", _who(actor), name, user)
        scopes = p.get("scopes") if isinstance(p.get("scopes"), list) else []
        expires = format_html(", expires {}", _text(p["expires_at"])) if p.get("expires_at") else mark_safe(", never expires")
        return format_html("{} created {} for {} (scopes: {}{})", _who(actor), name, user,
                           ", ".join(map(_text, scopes)) or "none", expires)
    return tell


def _spec(verb):
    def tell(say, p, actor, sid):
        agent_id = _text(p.get("agent_id") or "?")
        if verb != "deleted" and say.names.project:
            spec = format_html('<a href="{}"><code>{}</code></a>',
                               reverse("collab:spec", args=[say.names.project, agent_id]), agent_id)
        else:
            spec = format_html("<code>{}</code>", agent_id)
        fields = p.get("fields") if isinstance(p.get("fields"), list) else []
        changed = format_html(" ({})", ", ".join(_text(f).replace("_", " ") for f in fields)) if fields else mark_safe("")
        return format_html("{} {} agent spec {}{}", _who(actor), verb, spec, changed)
    return tell


def _webhook(verb):
    def tell(say, p, actor, sid):
        hook = format_html("webhook #{}", _text(p.get("webhook", "?")))
        host = p.get("host")
        if verb == "created":
            state = "" if p.get("active", True) else " (turned off)"
            return format_html("{} added {} to <code>{}</code>{}", _who(actor), hook, _text(host or "?"), state)
        if verb == "deleted":
            return format_html("{} deleted {} (<code>{}</code>)", _who(actor), hook, _text(host or "?"))
        if verb == "secret_rotated":
            return format_html("{} gave {} a new signing secret", _who(actor), hook)
        changes = {k: v for k, v in p.items() if k != "webhook"}
        if "active" in changes:
            changes["active"] = "on" if changes["active"] else "off"
        return format_html("{} changed {}: {}", _who(actor), hook, _changes(changes))
    return tell


_TELLERS = {
    "session.created": _session_created,
    "branch.created": _branch_created,
    "branch.renamed": _branch_renamed,
    "branch.archived": _branch_archived,
    "branch.internal_changed": _branch_internal,
    "message.created": _message_created,
    "message.delta": _message_delta,
    **{f"job.{state}": (lambda say, p, actor, sid, s=state: _job_state(say, p, actor, sid, s)) for state in JOB_STATES},
    "child.job": _child_job,
    "agent.spawned": _agent_spawned,
    "agent.interrupted": _agent_interrupted,
    "delivery.sent": lambda say, p, actor, sid: _delivery(say, p, actor, sid, "was sent to"),
    "delivery.received": lambda say, p, actor, sid: _delivery(say, p, actor, sid, "arrived for"),
    "delivery.held": _delivery_held,
    "delivery.approved": lambda say, p, actor, sid: _delivery_decided(say, p, actor, sid, "approved"),
    "delivery.rejected": _delivery_rejected,
    "delivery.started": _delivery_started,
    "inbox.queued": _inbox_queued,
    "inbox.drained": _inbox_drained,
    "inbox.dropped": _inbox_dropped,
    "followup.drained": lambda say, p, actor, sid: _followup(say, p, actor, sid, "reached its caller"),
    "followup.noticed": lambda say, p, actor, sid: _followup(
        say, p, actor, sid, "arrived after its caller was cancelled (kept as a notice)"),
    "followup.undeliverable": lambda say, p, actor, sid: _followup(say, p, actor, sid, "could not be delivered"),
    "execution.cancel_requested": _cancel_requested,
    "agents.listed": _agents_listed,
    "todo.created": _todo_created,
    "todo.updated": _todo_updated,
    "session.visibility_changed": _visibility_changed,
    "session.metadata_changed": _metadata_changed,
    "session.deleted": _session_deleted,
    "session.shared": _shared,
    "session.unshared": _unshared,
    "model.retry": _model_retry,
    "approval.requested": _asked(approval=True),
    "question.asked": _asked(approval=False),
    "approval.decided": _decided,
    "question.answered": _decided,
    "ask.closed": _ask_closed,
    **{f"member.{verb}": _member(verb)
       for verb in ("invited", "accepted", "declined", "role_changed", "removed", "invitation_cancelled")},
    "limits.changed": _limits_changed,
    "project.updated": _project_updated,
    "workspace.changed": _workspace_changed,
    "token.created": _token("created"),
    "token.revoked": _token("revoked"),
    **{f"agent_spec.{verb}": _spec(verb) for verb in ("created", "changed", "deleted")},
    **{f"webhook.{verb}": _webhook(verb) for verb in ("created", "updated", "deleted", "secret_rotated")},
}
KNOWN_TYPES = frozenset(_TELLERS)


# --- one turn -----------------------------------------------------------------------------------


def duration_words(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def _took(job: Job | None) -> str:
    if job is None or not job.started_at or not job.finished_at:
        return ""
    return duration_words((job.finished_at - job.started_at).total_seconds())


def turn_outcome(job: Job, now=None) -> str:
    """How the turn stands: "queued for 2.0 s", "running for 12 s", "succeeded in 3.2 s",
    "failed after 1.0 s (model_error)", …"""
    now = now or timezone.now()
    if job.status == "waiting":
        return "waiting for a person"
    if job.status == "queued":
        return f"queued for {duration_words(max((now - job.created_at).total_seconds(), 0))}"
    if job.status in ("running", "stopping"):
        ran = duration_words(max((now - job.started_at).total_seconds(), 0)) if job.started_at else ""
        if job.status == "running":
            return f"running for {ran}" if ran else "running"
        return f"stopping after {ran}" if ran else "stopping"
    took = _took(job)
    error = f" ({job.error_code})" if job.error_code else ""
    if job.status == "succeeded":
        return f"succeeded in {took}" if took else "succeeded"
    return f"{job.status} after {took}{error}" if took else f"{job.status}{error}"


def agent_of(job: Job) -> str:
    spec = job.agent_spec if job.agent_spec_id else None
    return spec.agent_id if spec is not None else "the default agent"


def turn_sentence(job: Job, *, here: str | None = None, now=None) -> SafeString:
    """One turn in a line: who asked which agent on which branch (linked), how it stands or ended,
    how long it took and its tokens. ``job``: read with its branch, agent spec, starter and
    session (``TURN_RELATED``); ``here``: the session whose page this is (not named again)."""
    agent = format_html("<code>{}</code>", agent_of(job))
    branch = format_html('<a href="{}">{}</a>', session_url(job.session_id, job.branch_id), job.branch.display_name)
    who = job.started_by.username if job.started_by_id and job.started_by else None
    if job.kind == "user":
        opening = format_html("{} asked {} on {}", _who(who), agent, branch)
    elif job.kind == "spawn":
        opening = format_html("{} started as a spawned agent on {}", agent, branch)
    elif job.kind == "followup":
        opening = format_html("a result went back to {} on {}", agent, branch)
    else:
        opening = format_html("{} for {} on {}", "a task" if job.kind == "task" else "a message", agent, branch)
    where = (format_html(" in session <a href=\"{}\">{}</a>", session_url(job.session_id),
                         job.session.title or short(job.session_id)) if job.session_id != here else mark_safe(""))
    tokens = job.tokens_in + job.tokens_out
    spent = format_html(", {} tokens", f"{tokens:,}") if tokens else mark_safe("")
    return format_html("{}{} — {}{}", opening, where, turn_outcome(job, now), spent)


TURN_RELATED = ("branch", "agent_spec", "started_by", "session")


def turn_jobs(**where):
    """Job rows as ``turn_sentence`` reads them: one query, the branch, spec, starter and session
    joined; the prompt and the result text (unbounded) left out."""
    return Job.objects.filter(**where).select_related(*TURN_RELATED).defer("prompt", "result_text")


def turn_details(job: Job) -> str:
    """What a turn's folded details say, one fact a line (plain text)."""
    def at(value):
        return timezone.localtime(value).strftime("%H:%M:%S") if value else "—"

    lines = [f"asked by   {job.started_by.username if job.started_by_id and job.started_by else '—'}",
             f"agent      {agent_of(job)} on {job.branch.display_name}",
             f"kind       {JOB_NOUNS.get(job.kind, job.kind)}",
             f"queued     {at(job.created_at)}"]
    if job.started_at:
        lines.append(f"started    {at(job.started_at)}")
    if job.cancel_requested_at:
        lines.append(f"stop asked {at(job.cancel_requested_at)}")
    if job.finished_at:
        lines.append(f"ended      {at(job.finished_at)} ({job.status})")
    else:
        lines.append(f"now        {job.status}")
    if job.tokens_in or job.tokens_out:
        lines.append(f"tokens     {job.tokens_in:,} in, {job.tokens_out:,} out")
    if job.model_calls or job.tool_calls:
        lines.append(f"calls      {_count(job.model_calls, 'model call', 'model calls')}, "
                     f"{_count(job.tool_calls, 'tool call', 'tool calls')}")
    if job.is_error and (job.error_code or job.error_reason):
        lines.append(f"error      {job.error_code}: {job.error_reason}".rstrip(": "))
    lines.append(f"execution  {job.pk}")
    return "\n".join(lines)


def visible_jobs_q(session) -> Q:
    """The jobs a session page tells about: its own, and its OpenWork children's (``child.job``)."""
    return Q(session=session) | Q(session__parent_session=session)
