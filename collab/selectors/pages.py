"""What the pages show, already limited to what the viewer may see (callers authorize the session)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Q
from django.utils import timezone

from collab.access import visible_session_ids, visible_sessions
from collab.errors import NotFound
from collab.models import OPEN_STATUSES, TERMINAL_STATUSES, Branch, Job, Message, MessageKind, Session, is_busy
from collab.selectors.branch_labels import branch_labels
from collab.selectors.transcript import STOPPED_STATUSES, generating_text, lineage, page_transcript, present_rows
from collab.selectors.redact import hidden_among, redact_jobs
from collab.selectors.sentences import turn_jobs, turn_sentence


def shown_branch(session: Session, branch_id: str | None = None, head_id: str | None = None) -> Branch | None:
    """The branch a page shows: the one asked for, the one holding ``head_id``, else the selected HEAD's."""
    if branch_id:
        return session.branches.filter(pk=branch_id).select_related("tip").first()
    if head_id:
        holder = Message.objects.filter(pk=head_id, session=session).values_list("branch_id", flat=True).first()
        if holder:
            return Branch.objects.select_related("tip").get(pk=holder)
    if session.head_id:
        return Branch.objects.select_related("tip").get(pk=session.head.branch_id)
    return session.branches.select_related("tip").order_by("created_at").first()


def transcript(session: Session, branch_id: str | None = None, head_id: str | None = None, *, viewer) -> dict:
    """The shown branch's transcript as the session page renders it (see ``page_transcript``)."""
    return page_transcript(session, viewer, branch_id=branch_id, head_id=head_id)


def running_state(branch: Branch | None) -> dict:
    """The branch's running turn as the page shows it: ``running`` (its status or None) and
    ``generating`` (what a streaming model has said so far)."""
    running = Job.objects.running().filter(branch=branch).first() if branch else None
    return {"running": running.status if running else None, "running_job": running,
            "generating": generating_text(running) if running else ""}


LIVE_ROWS = 100  # at most this many rows per live fetch; a client further behind reloads the transcript


class TooFarBehind(Exception):
    """The rows a client asks for are not a short tail of the branch: it reloads the transcript."""


def rows_after(session: Session, branch_id: str, after_id: str | None, *, viewer) -> dict:
    """For live updates: the rows of ``branch_id``'s lineage after message ``after_id`` (from its start
    when None), oldest first, for a page that shows that branch up to ``after_id``.

    The work is bounded by the number of new rows (at most ``LIVE_ROWS``), not by the branch's
    length: the walk back from the tip stops at ``after_id``'s depth. Raises ``NotFound`` for a
    branch or message not in the session, ``TooFarBehind`` when ``after_id`` is more than
    ``LIVE_ROWS`` rows behind the tip or not on the branch's lineage."""
    branch = session.branches.filter(pk=branch_id).select_related("tip").first()
    if branch is None:
        raise NotFound()
    after = None
    if after_id:
        after = Message.objects.filter(pk=after_id, session=session).only("pk", "depth").first()
        if after is None:
            raise NotFound()
    tip = branch.tip
    start = after.depth + 1 if after else 0
    count = (tip.depth - start + 1) if tip else 0
    if count > LIVE_ROWS or count < 0:
        raise TooFarBehind()
    if count == 0 and after is not None and after.pk != (tip.pk if tip else branch.forked_from_id):
        raise TooFarBehind()  # the page shows another lineage
    messages = lineage(tip, count) if count > 0 else []
    if messages and messages[0].predecessor_id != (after.pk if after else None):
        raise TooFarBehind()  # ``after_id`` is not on this branch's lineage
    present_rows(branch, messages, viewer, tail=True)
    return {"branch": branch, "messages": messages, "selected": None}


def message_row(session: Session, message_id: str, *, viewer, branch: Branch | None = None) -> Message:
    """One transcript row (a message of the session, with its attach pointers), e.g. after an
    attach pointer was hung off it, made readable as the page showing ``branch`` renders it."""
    message = Message.objects.filter(pk=message_id, session=session).exclude(kind=MessageKind.ATTACH).first()
    if message is None:
        raise NotFound()
    present_rows(branch, [message], viewer)
    return message


def stopped_row(session: Session, job: Job, *, viewer) -> Message | None:
    """The row a stopped turn's marker hangs on, re-rendered with it (a page that already shows the
    row gets it when the turn stops): the last row the turn wrote on its branch, else its prompt,
    else the node it was admitted at. None while the turn has not stopped. One query more than
    ``message_row``: the turn's last row, by its job."""
    if job.status not in STOPPED_STATUSES:
        return None
    last = (Message.objects.filter(job_id=job.pk, branch_id=job.branch_id).exclude(kind=MessageKind.ATTACH)
            .order_by("-depth").values_list("pk", flat=True).first())
    anchor = last or job.prompt_msg_id or job.parent_msg_id
    message = Message.objects.filter(pk=anchor, session=session).exclude(kind=MessageKind.ATTACH).first() if anchor else None
    if message is None:  # nothing of this session to hang it on (a fork's first turn from another session)
        return None
    present_rows(job.branch, [message], viewer, place=(job.pk,))
    return message


def session_job(session: Session, job_id: str, viewer) -> Job:
    job = session.jobs.select_related("branch").filter(pk=job_id).first()
    if job is None:
        raise NotFound()
    return redact_jobs(viewer, [job], own=session.pk)[0]


def branch_row(session: Session, branch_id: str) -> Branch:
    """One row of the branch list, with ``busy`` (a turn running on it) and ``label`` (as the
    whole list labels it: ``label_branches``)."""
    rows = list(session.branches.annotate(fork_parent=F("forked_from__branch_id")))
    branch = next((b for b in rows if b.pk == branch_id), None)
    if branch is None:
        raise NotFound()
    branch.busy = is_busy(branch)
    branch.label = label_branches(rows)[branch.pk]
    return branch


def recent_jobs(session: Session, viewer, limit: int = 20, *, replay=None) -> list[Job]:
    """The session's newest jobs, newest first; ``replay``: those that existed at its event, as
    they were then."""
    if replay is not None:
        jobs = replay.recent_jobs(session, limit)
    else:
        jobs = list(session.jobs.select_related("branch").order_by("-created_at")[:limit])
    return redact_jobs(viewer, jobs, own=session.pk)


def label_branches(rows) -> dict[str, str]:
    """Branch id -> the label the pages show it under (``branch_labels``); ``rows`` are every
    branch of one session, each with ``fork_parent`` (its fork point's branch)."""
    return branch_labels((b.pk, b.display_name, b.fork_parent) for b in rows)


def branches(session: Session, *, replay=None) -> list[Branch]:
    """The branch list: live ones first, then archived, each in creation order, with ``busy`` and
    ``label``. ``replay``: the branches that existed at its event, as they were then."""
    rows = list(session.branches.annotate(fork_parent=F("forked_from__branch_id")).order_by("created_at"))
    if replay is not None:
        rows = [then for b in rows if (then := replay.branch_then(b)) is not None]
        open_then = replay.open_branches()
        busy = {b for b, state in open_then.items() if state == "running"}
    else:
        busy = set(Job.objects.running().filter(session=session).values_list("branch_id", flat=True))
    labels = label_branches(rows)
    for b in rows:
        b.busy = b.pk in busy
        b.label = labels[b.pk]
    rows.sort(key=lambda b: b.archived)  # stable: creation order within each
    return rows


def top_level_sessions(project, viewer, search: str = "") -> list[Session]:
    """The project's root sessions ``viewer`` may see (at most 200, most recent first; ``search``
    narrows by title or id), each with ``sub_agents``: its OpenWork children, listed under it
    rather than at the top level. Two queries, however many sessions."""
    roots = visible_sessions(viewer).filter(project=project, parent_session__isnull=True)
    if search:
        roots = roots.filter(Q(title__icontains=search) | Q(pk=search))
    sessions = list(roots.order_by("-last_active_at")[:200])
    children: dict[str, list] = {}
    for child in Session.objects.filter(parent_session__in=[s.pk for s in sessions]).order_by("title"):
        children.setdefault(child.parent_session_id, []).append(child)
    for s in sessions:
        s.sub_agents = children.get(s.pk, [])
    return sessions


def visible_session_count(project, viewer) -> int:
    """How many root sessions of the project ``viewer`` may see (one query)."""
    return visible_sessions(viewer).filter(project=project, parent_session__isnull=True).count()


def holds_of(session: Session, *, status: str | None = "pending", limit: int = 200) -> list:
    """Deliveries from this session held by a watch policy (``GET /api/sessions/{sid}/holds``),
    by ``status`` (any when empty); ``limit`` kept in 1–1000."""
    holds = session.held_deliveries.select_related("target_branch", "sender_branch", "decided_by")
    if status:
        holds = holds.filter(status=status)
    return list(holds[: max(1, min(limit, 1000))])


def pending_holds(session: Session, viewer):
    """Deliveries from this session waiting for a person; one to a session ``viewer`` may not
    see says only "another session" (``target_hidden``), no name."""
    holds = list(session.held_deliveries.filter(status="pending").select_related("target_branch"))
    hidden = hidden_among(viewer, {h.target_branch.session_id for h in holds}, own=session.pk)
    for h in holds:
        h.target_hidden = h.target_branch.session_id in hidden
    return holds


# --- the home page (docs/web-app.md#the-home-page) ------------------------------------------------

HOME_RUNNING = 50  # open turns listed at most
HOME_FINISHED = 20  # ended turns listed at most, newest first
FIRST_VISIT = timedelta(days=1)  # a first visit lists what ended in the last day


@dataclass
class Home:
    running: list  # open jobs (``OPEN_STATUSES``), oldest first, each with ``sentence``
    finished: list  # jobs ended since ``since``, newest first, each with ``sentence``
    since: datetime  # where "finished" starts
    first_visit: bool
    more_running: bool = False  # more than shown
    more_finished: bool = False


def home(viewer, last_visit: datetime | None, now: datetime | None = None) -> Home:
    """What matters across ``viewer``'s projects, in sessions they may see: the turns running or
    queued now, and those that ended since ``last_visit`` (the last day on a first visit), each in
    a sentence (``turn_sentence``) linking to its session and branch. Two queries (the open turns,
    the ended ones), and one more when a turn's error names a session (``redact_jobs``)."""
    now = now or timezone.now()
    since = last_visit or now - FIRST_VISIT
    visible = visible_session_ids(viewer)
    running = list(turn_jobs(status__in=OPEN_STATUSES, session_id__in=visible)
                   .order_by("created_at", "pk")[:HOME_RUNNING + 1])
    finished = list(turn_jobs(status__in=TERMINAL_STATUSES, finished_at__gt=since, session_id__in=visible)
                    .order_by("-finished_at", "-pk")[:HOME_FINISHED + 1])
    shown = redact_jobs(viewer, running[:HOME_RUNNING] + finished[:HOME_FINISHED])
    for job in shown:
        job.sentence = turn_sentence(job, now=now)
    return Home(running=shown[:min(len(running), HOME_RUNNING)], finished=shown[min(len(running), HOME_RUNNING):],
                since=since, first_visit=last_visit is None, more_running=len(running) > HOME_RUNNING,
                more_finished=len(finished) > HOME_FINISHED)
