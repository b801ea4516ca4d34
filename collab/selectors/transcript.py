"""Reading a branch's history without re-serializing it."""

import json
from dataclasses import dataclass
from urllib.parse import urlencode

from django.db import connection
from django.db.models import Q
from django.urls import reverse
from django.utils.translation import ngettext

from collab.access import visible_sessions
from collab.errors import NotFound
from collab.models import (
    ACTIVE_STATUSES,
    Branch,
    Event,
    Job,
    JobStatus,
    Message,
    MessageKind,
    Session,
)
from collab.selectors.redact import redact_jobs, redact_messages, scrub
from collab.deliveries import split_delivery

_CHAIN_SQL = """
WITH RECURSIVE chain(id, predecessor_id, n) AS (
    SELECT id, predecessor_id, 1 FROM collab_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.predecessor_id, c.n + 1 FROM collab_message m JOIN chain c ON m.id = c.predecessor_id
    WHERE %s = 0 OR c.n < %s
)
SELECT id FROM chain
"""


def lineage_ids(tip_id: str, limit: int = 0) -> list[str]:
    """Ids from ``tip_id`` back towards the root (newest first), at most ``limit`` (0 = all)."""
    with connection.cursor() as cursor:
        cursor.execute(_CHAIN_SQL, [tip_id, limit, limit])
        return [row[0] for row in cursor.fetchall()]


def lineage(tip: Message | None, limit: int = 0) -> list[Message]:
    """The messages from the root (or the last ``limit``) to ``tip``, oldest first."""
    if tip is None:
        return []
    ids = lineage_ids(tip.pk, limit)
    return list(Message.objects.filter(pk__in=ids).order_by("depth"))


_WINDOW_SQL = """
WITH RECURSIVE chain(id, predecessor_id, turn) AS (
    SELECT id, predecessor_id, turn FROM collab_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.predecessor_id, m.turn FROM collab_message m JOIN chain c ON m.id = c.predecessor_id
    WHERE c.turn >= %s
)
SELECT id FROM chain WHERE turn >= %s
"""


def lineage_from_turn(tip: Message, min_turn: int) -> list[Message]:
    """The lineage of ``tip`` restricted to turns ``>= min_turn``, oldest first.

    Walks back only as far as the window needs, so reading the last turns of a
    100k-message branch costs about what it costs on a short one.
    """
    with connection.cursor() as cursor:
        cursor.execute(_WINDOW_SQL, [tip.pk, min_turn, min_turn])
        ids = [row[0] for row in cursor.fetchall()]
    return list(Message.objects.filter(pk__in=ids).order_by("depth"))


DEFAULT_MAX_CHARS = 60_000
MIN_MAX_CHARS = 100
MAX_MAX_CHARS = 200_000  # read_conversation and the transcript route clamp max_chars to this range
TOOL_RESULT_CHARS = 4_000


def _render_message(m: Message, include_function_calls: bool) -> str | None:
    if m.kind == "attach":
        return None
    if m.role == "tool":
        if not include_function_calls:
            return None
        tool = (m.metadata or {}).get("tool", "tool")
        text = m.text if len(m.text) <= TOOL_RESULT_CHARS else m.text[:TOOL_RESULT_CHARS] + " […]"
        return f"[tool result: {tool}] {text}"
    if m.role == "assistant" and m.tool_calls:
        if not include_function_calls:
            return f"[assistant] {m.text}" if m.text else None
        calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments', {}), ensure_ascii=False)})" for c in m.tool_calls)
        return f"[assistant] {m.text + ' ' if m.text else ''}→ {calls}"
    label = m.role if m.kind in ("normal",) else f"{m.role}:{m.kind}"
    return f"[{label}] {m.text}"


def render_transcript(branch, *, viewer, start_turn: int = 0, end_turn: int | None = None,
                      include_function_calls: bool = True, max_chars: int = DEFAULT_MAX_CHARS) -> dict:
    """``read_conversation``'s rendering (docs/contract.md#read_conversation). Turns are numbered from 0;
    negative bounds count from the end; later turns beyond ``max_chars`` are dropped. A session
    ``viewer`` may not see, named in a message (a prompt's "[task from SID:MSG]" header, a
    result's source, a tool call), reads "another session"."""
    tip = branch.tip
    total = tip.turn if tip else 0
    indices = range(total)[slice(start_turn, end_turn)]
    base = {"session_id": branch.session_id, "branch": branch.pk, "name": branch.display_name,
            "address": branch.address, "archived": branch.archived, "total_turns": total}
    if not indices:
        text = f"(no turns in range; the branch has {total} {ngettext('turn', 'turns', total)})"
        return {**base, "text": text, "turns": [], "omitted_turns": 0}
    first, last = indices[0], indices[-1]
    messages = [m for m in lineage_from_turn(tip, first + 1) if m.turn <= last + 1]
    redact_messages(viewer, branch.session_id, messages)
    by_turn: dict[int, list[Message]] = {}
    for m in messages:
        by_turn.setdefault(m.turn - 1, []).append(m)
    parts, turns, used, omitted = [], [], 0, 0
    for index in indices:
        lines = [line for m in by_turn.get(index, []) if (line := _render_message(m, include_function_calls))]
        block = f"## turn {index}\n" + "\n".join(lines)
        if parts and used + len(block) > max_chars:
            omitted = len(indices) - len(turns)
            break
        if not parts and len(block) > max_chars:
            block = block[:max_chars] + " […]"
        parts.append(block)
        used += len(block) + 2
        turns.append({"index": index, "messages": [
            {"id": m.pk, "role": m.role, "kind": m.kind, "text": m.text, "tool_calls": m.tool_calls,
             "tool": (m.metadata or {}).get("tool")}
            for m in by_turn.get(index, []) if m.kind != "attach"
        ]})
    text = "\n\n".join(parts)
    if omitted:
        text += (f"\n\n[{omitted} later {ngettext('turn', 'turns', omitted)} omitted by max_chars={max_chars}; "
                 f"read on with start_turn={turns[-1]['index'] + 1}]")
    return {**base, "text": text, "turns": turns, "omitted_turns": omitted}


# --- the session page's transcript: reading a branch ------------------------------------------------

PAGE_WINDOW = 200  # messages of the shown branch on one page
STOPPED_STATUSES = (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED)
RESULT_KINDS = frozenset({MessageKind.AGENT_MESSAGE, MessageKind.FOLLOWUP, MessageKind.NOTICE})
# a turn's prompt written for the model with a header (``[task from …]``, ``[message from …]``):
# (card kind, label) of the card a person reads instead
DELIVERY_LABELS = {MessageKind.TASK: ("task", "task from"), MessageKind.MESSAGE: ("message", "message from"),
                   MessageKind.AGENT_SPAWN: ("spawn", "started by")}
DELIVERY_KINDS = frozenset(DELIVERY_LABELS)
OPEN_BODY_CHARS = 600  # a card's body up to this long is shown open; longer ones start collapsed

_IS_ANCESTOR_SQL = """
WITH RECURSIVE chain(id, predecessor_id, depth) AS (
    SELECT id, predecessor_id, depth FROM collab_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.predecessor_id, m.depth FROM collab_message m JOIN chain c ON m.id = c.predecessor_id
    WHERE c.depth > %s
)
SELECT 1 FROM chain WHERE id = %s
"""


def _is_ancestor(node: Message, tip: Message) -> bool:
    """Whether ``node`` lies on the lineage of ``tip`` (one query; walks only down to its depth)."""
    if node.depth > tip.depth:
        return False
    with connection.cursor() as cursor:
        cursor.execute(_IS_ANCESTOR_SQL, [tip.pk, node.depth, node.pk])
        return cursor.fetchone() is not None


def _branch_rows():
    return Branch.objects.select_related("tip", "forked_from", "forked_from__branch")


def resolve_shown(session: Session, *, branch_id: str | None = None, head_id: str | None = None,
                  remembered: str | None = None) -> tuple[Branch | None, Message | None]:
    """The branch a viewer reads and the message they are positioned at.

    ``branch_id`` / ``head_id`` come from the viewer's URL: an id that names nothing in this
    session is a 404 (like a session they may not see). Without them, ``remembered`` (the
    branch this viewer last read here, from their own web session) if it still exists, else
    the session's default: the selected HEAD's branch, else its first branch. Nothing here
    depends on what another viewer, a fork or an agent did since."""
    head = None
    if head_id:
        head = Message.objects.filter(pk=head_id, session=session).exclude(kind=MessageKind.ATTACH).first()
        if head is None:
            raise NotFound("no such message in this session")
    if branch_id:
        branch = _branch_rows().filter(pk=branch_id, session=session).first()
        if branch is None:
            raise NotFound("no such branch in this session")
        return branch, head
    if head is not None:
        return _branch_rows().get(pk=head.branch_id), head
    if remembered:
        branch = _branch_rows().filter(pk=remembered, session=session).first()
        if branch is not None:
            return branch, None
    if session.head_id:
        branch = _branch_rows().filter(messages__pk=session.head_id).first()
        if branch is not None:
            return branch, None
    return _branch_rows().filter(session=session).order_by("created_at").first(), None


def _window(branch: Branch, head: Message | None, size: int) -> tuple[list[Message], Message | None, int]:
    """(messages oldest first, the head if it is on this branch's lineage, how many newer messages
    of the branch the window leaves out). The window ends at the tip, or at ``head`` when the
    head is older than the tip's window, so the node asked for is always on the page."""
    tip = branch.tip
    if tip is None:
        return [], None, 0
    ids = lineage_ids(tip.pk, size)
    newer = 0
    if head is not None and head.pk not in ids:
        if _is_ancestor(head, tip):
            ids = lineage_ids(head.pk, size)
            newer = tip.depth - head.depth
        else:
            head = None  # a node of another line: show the branch, position nowhere
    return list(Message.objects.filter(pk__in=ids).order_by("depth")), head, newer


def pretty_arguments(arguments) -> str:
    """A tool call's arguments as people read JSON: indented, non-ASCII as itself."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    try:
        return json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return str(arguments)


@dataclass
class Card:
    """What a person reads instead of the text a model was given."""

    kind: str  # result | task | message | spawn | notice
    label: str  # "result from", "task from", …
    agent: str = ""  # the other agent's name ("" when hidden)
    href: str = ""  # its session/branch, at the node ("" when hidden)
    hidden: bool = False  # the other side is in a session the viewer may not see
    status: str = ""
    job: str = ""  # the job whose state ``status`` shows (live updates re-render the row when it changes)
    duration: float | None = None
    tokens: int = 0
    body: str = ""
    open: bool = True
    note: str = ""


def _duration(job: Job | None) -> float | None:
    if job is None or not job.started_at or not job.finished_at:
        return None
    return max((job.finished_at - job.started_at).total_seconds(), 0.0)


def _node_href(session_id: str, branch_id: str | None, head_id: str | None) -> str:
    """The session page of ``session_id`` showing that branch, positioned at that node."""
    query = urlencode({k: v for k, v in (("branch", branch_id), ("head", head_id)) if v})
    return reverse("collab:session", args=[session_id]) + (f"?{query}" if query else "")


def _card_body(m: Message) -> tuple[str, str, bool]:
    """(body, source address, found) of a delivered text: the recorded ``body`` span; else the
    text after the recorded ``header``; else the producer's own reading of its format (older
    rows); else (not ``found``) the whole text."""
    meta = m.metadata or {}
    span = meta.get("body")
    if isinstance(span, list) and len(span) == 2 and all(isinstance(i, int) for i in span):
        return m.text[span[0]:span[1]], meta.get("from") or "", True
    header = meta.get("header")
    if header and m.text.startswith(header):
        return m.text[len(header):].lstrip("\n"), "", True
    parsed = split_delivery(m.text)
    if parsed is not None:
        return parsed[1], parsed[0], True
    return m.text, "", False


def _job_facts(card: Card, job: Job | None) -> None:
    if job is None:
        return
    card.status = job.status
    card.job = job.pk
    card.duration = _duration(job)
    card.tokens = job.tokens_in + job.tokens_out


def _hide(card: Card, found: bool) -> Card:
    """A card whose other side the viewer may not see: no name, no link, no id (a body that could
    not be told from its header may carry ids, so it goes too)."""
    card.hidden, card.agent, card.href = True, "", ""
    if not found:
        card.body = ""
    return card


def _result_card(m: Message, jobs: dict, seen: set) -> Card:
    """A result delivered to this branch (follow-up turn, mailbox drain, notice): who produced it
    (their branch, at the node the result came from), how it ended, the result itself."""
    meta = m.metadata or {}
    source_job = jobs.get(meta.get("result_of") or meta.get("followup_of"))
    body, source, found = _card_body(m)
    card = Card(kind="result", label="result from", body=body, status=meta.get("status") or "")
    if m.kind == MessageKind.NOTICE and meta.get("cancelled_with"):
        card.note = "its caller was cancelled, so no turn was started"
    elif m.kind == MessageKind.FOLLOWUP:
        card.note = "delivered as a follow-up turn"
    if not (meta.get("result_of") or meta.get("followup_of")):
        card.label = "result"  # a delivery that names no execution: nothing to link to
        return card
    if source_job is None or source_job.session_id not in seen:
        return _hide(card, found)
    _job_facts(card, source_job)
    card.agent = source_job.branch.task_name or source_job.branch.display_name
    head = source.partition(":")[2] if source.startswith(f"{source_job.session_id}:") else source_job.prompt_msg_id
    card.href = _node_href(source_job.session_id, source_job.branch_id, head)
    return card


def _delivery_card(m: Message, jobs: dict, seen: set) -> Card:
    """A turn another agent started here (task, message, spawn): from whom (their branch, at the
    calling node), this turn's state, the prompt without the header written for the model."""
    kind, label = DELIVERY_LABELS[m.kind]
    body, _, found = _card_body(m)
    card = Card(kind=kind, label=label, body=body)
    job = jobs.get(m.job_id)
    _job_facts(card, job)
    caller_sid, _, caller_mid = ((m.metadata or {}).get("caller") or "").partition(":")
    if not caller_sid:
        return card
    if caller_sid not in seen:
        return _hide(card, found)
    branch = job.caller_branch if job is not None else None
    card.agent = (branch.task_name or branch.display_name) if branch is not None else "another agent"
    card.href = _node_href(caller_sid, branch.pk if branch is not None else None, caller_mid or None)
    return card


def _attach_facts(pointer: Message, jobs: dict) -> None:
    attach = (pointer.metadata or {}).get("attach", {})
    job = jobs.get(attach.get("execution_id"))
    pointer.card = Card(kind="attach", label="", status=job.status if job else "", job=job.pk if job else "",
                        duration=_duration(job),
                        tokens=(job.tokens_in + job.tokens_out) if job else 0,
                        agent=job.branch.display_name if job else "",
                        href=_node_href(attach.get("session_id"), attach.get("branch"), attach.get("head_id")))


def _stop_anchor(job: Job, position: dict, last_written: dict) -> str | None:
    """The message after which a stopped turn's marker goes: the last one it wrote, else its
    prompt, else the node it was admitted at."""
    for candidate in (last_written.get(job.pk), job.prompt_msg_id, job.parent_msg_id):
        if candidate in position:
            return candidate
    return None


def present_rows(branch: Branch | None, messages: list[Message], viewer, *, tail: bool = False,
                 place: tuple = (), replay=None) -> Job | None:
    """Make ``messages`` (consecutive nodes of ``branch``'s line, oldest first) readable for
    ``viewer``, in place: ``card`` (deliveries), ``calls`` (tool calls as JSON), ``tool``,
    ``attaches`` (pointers into sessions the viewer may see, with their job's state), ``stops``
    (the branch's cancelled or failed turns that stopped after that row) and ``inherited``.
    Four queries whatever the number of rows (pointers, jobs, visibility); returns the branch's
    running job. Usable for any slice of the line, e.g. rows appended live.

    A stopped turn is marked after the last of its rows in the slice, else its prompt, else the
    node it was admitted at — found by its prompt or that node being in the slice; with ``tail``
    (the slice ends where the page's rows end: its window, rows appended live) also by a row it
    wrote, so a turn that stops after its prompt scrolled away, or whose last row arrives live,
    is marked too. ``place``: ids of stopped turns whose marker the caller knows is on these rows
    (one row re-rendered in place, ``collab.selectors.pages.stopped_row``).

    ``replay`` (``collab.selectors.replay.Replay``): as at its event — the pointers written by
    then, every job in its state then (a turn that stopped later is no marker, one running then
    is the running job)."""
    ids = [m.pk for m in messages]
    pointers = Message.objects.filter(predecessor_id__in=ids, kind=MessageKind.ATTACH)
    if replay is not None:
        pointers = pointers.filter(pk__in=replay.messages())
    pointers = list(pointers) if ids else []

    wanted: set = set()
    for m in messages:
        meta = m.metadata or {}
        if m.kind in RESULT_KINDS:
            wanted.add(meta.get("result_of") or meta.get("followup_of"))
        if m.kind in DELIVERY_KINDS and m.job_id:
            wanted.add(m.job_id)
    wanted |= {(p.metadata or {}).get("attach", {}).get("execution_id") for p in pointers}
    wanted.discard(None)
    jobs: dict = {}
    if branch is not None:
        stopped_here = Q(prompt_msg_id__in=ids) | Q(parent_msg_id__in=ids)
        if place:
            stopped_here |= Q(pk__in=place)
        if tail:
            stopped_here |= Q(pk__in={m.job_id for m in messages if m.job_id})
        running_now = Q(status__in=ACTIVE_STATUSES) if replay is None else Q(pk__in=replay.open_job_ids())
        on_branch = Q(branch=branch) & (running_now | (Q(status__in=STOPPED_STATUSES) & stopped_here))
        rows = list(Job.objects.filter(Q(pk__in=wanted) | on_branch).select_related("branch", "caller_branch"))
        if replay is not None:
            replay.project_jobs(rows)
        jobs = {j.pk: j for j in rows}

    targets = {(p.metadata or {}).get("attach", {}).get("session_id") for p in pointers}
    targets |= {(m.metadata or {}).get("spawned_from_session") for m in messages}
    targets |= {((m.metadata or {}).get("caller") or "").partition(":")[0] for m in messages}
    targets |= {j.session_id for j in jobs.values()}
    targets -= {None, ""}
    seen = set(visible_sessions(viewer).filter(pk__in=targets).values_list("pk", flat=True)) if targets else set()

    attaches: dict[str, list[Message]] = {}
    for pointer in pointers:
        if (pointer.metadata or {}).get("attach", {}).get("session_id") in seen:
            _attach_facts(pointer, jobs)
            attaches.setdefault(pointer.predecessor_id, []).append(pointer)

    position = {m.pk: i for i, m in enumerate(messages)}
    last_written = {m.job_id: m.pk for m in messages if m.job_id}  # oldest first: the last one wins
    stops: dict[str, list[Job]] = {}
    running = None
    for job in sorted(jobs.values(), key=lambda j: (j.created_at, j.pk)):
        if branch is None or job.branch_id != branch.pk:
            continue
        if job.status in ACTIVE_STATUSES:
            running = job
        elif job.status in STOPPED_STATUSES and (anchor := _stop_anchor(job, position, last_written)):
            stops.setdefault(anchor, []).append(job)

    for m in messages:
        meta = m.metadata or {}
        m.attaches = attaches.get(m.pk, [])
        m.stops = stops.get(m.pk, [])
        m.inherited = branch is not None and m.branch_id != branch.pk
        m.card = None
        if m.kind in RESULT_KINDS:
            m.card = _result_card(m, jobs, seen)
        elif m.kind in DELIVERY_KINDS:
            m.card = _delivery_card(m, jobs, seen)
        if m.card is not None:
            m.card.open = len(m.card.body) <= OPEN_BODY_CHARS
        if meta.get("spawned_from_session") not in seen | {None}:  # after the card, which hides the caller
            m.metadata = {k: v for k, v in meta.items() if k not in ("spawned_from_session", "caller")}
        if m.role == "tool":
            m.tool = meta.get("tool") or "tool"
    # A hidden session's id in text, tool calls or card bodies reads "another session"
    # (the cards were cut from the unscrubbed text, whose recorded body spans it matches).
    hidden = redact_messages(viewer, branch.session_id if branch is not None else None, messages) if messages else {}
    redact_jobs(viewer, [j for found in stops.values() for j in found], own=branch.session_id if branch else None)
    for m in messages:
        if hidden and m.card is not None:
            m.card.body, m.card.note = scrub(m.card.body, hidden), scrub(m.card.note, hidden)
        m.calls = [{"name": c.get("name", "?"), "arguments": pretty_arguments(c.get("arguments", {}))}
                   for c in (m.tool_calls or []) if isinstance(c, dict)]
    return running


def page_transcript(session: Session, viewer, *, branch_id: str | None = None, head_id: str | None = None,
                    remembered: str | None = None, window: int | None = None, replay=None) -> dict:
    """The transcript a viewer reads on the session page, in a constant number of
    queries however long the branch: the shown branch (see ``resolve_shown``), the last ``window``
    messages of its line (or those ending at the head asked for), split into the history inherited
    from the branch it forked from and its own, made readable by ``present_rows``. Cards and attach
    pointers that lead into a session ``viewer`` may not see name nothing of it.

    ``replay`` (``collab.selectors.replay.Replay``): the branch as it was at its event, its line
    ending at the message it had reached then; a head written later positions nowhere. A branch
    asked for by id that did not exist yet is shown empty (``not_yet``); one only remembered gives
    way to the session's first branch."""
    branch, head = resolve_shown(session, branch_id=branch_id, head_id=head_id, remembered=remembered)
    not_yet = False
    if replay is not None:
        branch, head, not_yet = _as_replayed(session, replay, branch, head, asked=bool(branch_id))
    messages, head, newer = _window(branch, head, window or PAGE_WINDOW) if branch and not not_yet else ([], None, 0)
    running = present_rows(branch, messages, viewer, tail=True, replay=replay)
    inherited = [m for m in messages if m.inherited]
    fork_at = branch.forked_from if branch is not None else None
    return {
        "branch": branch, "messages": messages, "inherited": inherited,
        "own": [m for m in messages if not m.inherited],
        "fork_at": fork_at if fork_at is not None and fork_at.session_id == session.pk else None,
        "clipped": bool(messages) and messages[0].depth > 0, "newer": newer,
        "selected": head.pk if head is not None else None,
        "selected_inherited": head is not None and head.pk in {m.pk for m in inherited},
        "running": running.status if running else None, "running_job": running,
        "generating": generating_text(running) if running and replay is None else "",
        "not_yet": not_yet,
    }


def _as_replayed(session: Session, replay, branch: Branch | None, head: Message | None, *, asked: bool):
    """(branch, head, not yet created) for a replay: the branch as it was then with its tip then
    (in memory, never saved), the head only if it was written by then."""
    if head is not None and not replay.has_message(head.pk):
        head = None
    if branch is None:
        return None, None, False
    then = replay.branch_then(branch)
    if then is None and not asked:  # remembered, or the selected HEAD's: the first branch then
        first = _branch_rows().filter(session=session).order_by("created_at").first()
        then = replay.branch_then(first) if first is not None else None
    if then is None:
        return branch, None, True
    then.tip = replay.tip_of(then)
    return then, head, False


def generating_text(job: Job) -> str:
    """What a streaming model has said so far in the running job's current model call."""
    deltas = list(
        Event.objects.filter(session_id=job.session_id, type="message.delta", payload__job=job.pk)
        .order_by("seq").values_list("payload", flat=True)
    )
    if not deltas:
        return ""
    current = deltas[-1].get("call")
    return "".join(d.get("text", "") for d in deltas if d.get("call") == current)
