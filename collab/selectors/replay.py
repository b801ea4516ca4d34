"""A session as it was at event N of its log: the session page's ``?at=N`` (docs/web-app.md#replay).

The log decides what "at N" means, not the rows' timestamps: event N is the ``seq`` of one
event, and rows and events are stamped by different clocks (a job's ``created_at`` is the
database's ``now()``, its transaction's start; events take the application's time), so times
alone would misplace what happened within the same moment. From the log:

- messages: those whose ``message.created`` has ``seq <= N`` (``replay_cutoff``);
- branches: those created by then (``session.created`` names the first, ``branch.created`` the
  others), under the name they had then (``branch.created``'s, or their last ``branch.renamed``
  by then), archived when their ``branch.archived`` came by then, with that event's reason;
- jobs: those admitted by then, each in the status its last ``job.*`` event by then names; its
  tokens, end time and error only once it had ended by then.

Rows the log says nothing about go by their timestamps against event N's time: a branch written
without a ``branch.created`` (rows older than that event), a job recorded already ended (a
delivery refused before it ran: ``collab.services.followup.record_failed_delivery``), and a job of
another session, whose log this replay does not read (the status a card shows).

Building the state costs three queries whatever N: event N's time, the session's branch events,
its job events (two short fields a row).
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models.fields.json import KeyTextTransform

from collab.errors import Invalid
from collab.models import (
    ACTIVE_STATUSES,
    OPEN_STATUSES,
    TERMINAL_STATUSES,
    Event,
    Job,
    JobStatus,
    Message,
    MessageKind,
)

BRANCH_EVENTS = ("session.created", "branch.created", "branch.renamed", "branch.archived")


LANE_STATES = ("running", "waiting for a person", "queued")  # a branch with several open jobs shows the first


def lane_state(status: str, before: str | None = None) -> str:
    """What a live lane says of a branch with an open job of ``status`` (``before``: what another
    open job of it said already): running (or stopping), waiting for a person, or queued."""
    state = ("running" if status in ACTIVE_STATUSES else
             "waiting for a person" if status == JobStatus.WAITING else "queued")
    return min(state, before, key=LANE_STATES.index) if before else state



def replay_cutoff(session_id: str, at: int):
    """The ids of the messages written at or before event ``at`` (a subquery)."""
    return (Event.objects.filter(session_id=session_id, type="message.created", seq__lte=at)
            .annotate(mid=KeyTextTransform("id", "payload")).values("mid"))


def check_at(value: str | None, session) -> int | None:
    """``?at=`` as given: None when absent, else an event number of this session (1 to its last);
    anything else is a 400 naming the range."""
    if value is None:
        return None
    last = session.last_event_seq
    if not (value.isascii() and value.isdigit() and len(value) <= 18) or not 0 < int(value) <= last:
        raise Invalid(f"at must be an event number from 1 to {last}", code="invalid_event")
    return int(value)


@dataclass
class Replay:
    """What the log says about the session up to event ``at`` (of ``last``); see the module."""

    session_id: str
    at: int
    last: int
    time: datetime  # event ``at``'s
    created: dict = field(default_factory=dict)  # branch id -> seq of its creation (every one the log holds)
    names: dict = field(default_factory=dict)  # branch id -> its name at ``at`` (created or renamed by then)
    archived: dict = field(default_factory=dict)  # branch id -> archive reason, archived by ``at``
    archived_later: set = field(default_factory=set)  # branch ids archived after ``at``
    jobs: dict = field(default_factory=dict)  # job id -> status at ``at`` (admitted by then), in admission order
    logged_jobs: set = field(default_factory=set)  # every job the log has an event of
    _open_branches: dict | None = None

    def messages(self):
        """The ids of the messages written by then (a subquery: ``replay_cutoff``)."""
        return replay_cutoff(self.session_id, self.at)

    def query(self, **params) -> str:
        """``?at=N`` plus ``params`` that are set: a link that stays in this replay."""
        extra = "".join(f"&{k}={v}" for k, v in params.items() if v)
        return f"?at={self.at}{extra}"

    # --- branches --------------------------------------------------------------------------

    def branch_existed(self, branch) -> bool:
        if branch.pk in self.created:
            return self.created[branch.pk] <= self.at
        return branch.created_at <= self.time  # written without its event

    def branch_then(self, branch):
        """``branch`` (in memory, never saved) as it was then: its name, archive state and reason;
        None when it did not exist yet."""
        if not self.branch_existed(branch):
            return None
        branch.name = self.names.get(branch.pk, branch.name)
        if branch.pk in self.archived:
            branch.archived, branch.archive_reason = True, self.archived[branch.pk]
        elif branch.pk in self.archived_later or not branch.archived or branch.archived_at is None:
            branch.archived, branch.archive_reason = False, ""
        else:  # archived without an event: by its time
            branch.archived = branch.archived_at <= self.time
            branch.archive_reason = branch.archive_reason if branch.archived else ""
        return branch

    def tip_of(self, branch):
        """The branch's newest message written by then (None before its first)."""
        return (Message.objects.filter(branch_id=branch.pk, pk__in=self.messages()).exclude(kind=MessageKind.ATTACH)
                .order_by("-depth").first())

    def has_message(self, message_id: str) -> bool:
        return Message.objects.filter(pk=message_id, pk__in=self.messages()).exists()

    # --- jobs ------------------------------------------------------------------------------

    def job_status(self, job) -> str | None:
        """``job``'s status then; None when it did not exist yet."""
        if job.session_id == self.session_id and job.pk in self.logged_jobs:
            return self.jobs.get(job.pk)
        if job.created_at > self.time:
            return None
        if job.finished_at is not None and job.finished_at <= self.time:
            return job.status
        if job.started_at is not None and job.started_at <= self.time:
            return JobStatus.RUNNING
        return JobStatus.QUEUED

    def project_jobs(self, jobs):
        """Each job (in memory, never saved) as it was then: its status ("" when it did not exist
        yet); tokens, end and error only if it had ended by then. Returns ``jobs``."""
        for job in jobs:
            status = self.job_status(job)
            if status not in TERMINAL_STATUSES:
                job.tokens_in = job.tokens_out = 0
                job.finished_at = None
                job.is_error, job.error_code, job.error_reason = False, "", ""
            job.status = status or ""
        return jobs

    def open_branches(self) -> dict[str, str]:
        """Branch id -> "running", "waiting for a person" or "queued" (``lane_state``): the
        branches with a job open then (one query, once)."""
        if self._open_branches is None:
            open_jobs = {j: s for j, s in self.jobs.items() if s in OPEN_STATUSES}
            self._open_branches = {}
            if open_jobs:
                for pk, branch_id in Job.objects.filter(pk__in=list(open_jobs)).values_list("pk", "branch_id"):
                    self._open_branches[branch_id] = lane_state(open_jobs[pk], self._open_branches.get(branch_id))
        return self._open_branches

    def open_job_ids(self) -> list[str]:
        return [j for j, s in self.jobs.items() if s in OPEN_STATUSES]

    def recent_jobs(self, session, limit: int = 20) -> list:
        """The ``limit`` newest jobs that existed then, newest first, as they were then (two queries)."""
        admitted = list(self.jobs)[-limit:]
        logged = (Event.objects.filter(session_id=self.session_id, type__startswith="job.")  # (no NULL: NOT IN)
                  .annotate(jid=KeyTextTransform("job", "payload")).filter(jid__isnull=False).values("jid"))
        rows = list(session.jobs.select_related("branch").filter(pk__in=admitted))
        rows += list(session.jobs.select_related("branch").filter(created_at__lte=self.time)
                     .exclude(pk__in=logged).order_by("-created_at")[:limit])
        rows.sort(key=lambda j: (j.created_at, j.pk), reverse=True)
        return self.project_jobs(rows[:limit])


def replay_state(session, at: int) -> Replay:
    """The session's log read up to event ``at`` (``check_at`` has checked it); three queries."""
    sid = session.pk
    time = Event.objects.filter(session_id=sid, seq=at).values_list("created_at", flat=True).first()
    if time is None:
        raise Invalid("no such event in this session", code="invalid_event")
    state = Replay(session_id=sid, at=at, last=session.last_event_seq, time=time)
    for seq, type_, payload in (Event.objects.filter(session_id=sid, type__in=BRANCH_EVENTS).order_by("seq")
                                .values_list("seq", "type", "payload")):
        payload = payload if isinstance(payload, dict) else {}
        branch = payload.get("branch")
        if not isinstance(branch, str):
            continue
        if type_ in ("session.created", "branch.created"):
            state.created.setdefault(branch, seq)
            if seq <= at and isinstance(payload.get("name"), str):
                state.names[branch] = payload["name"]
        elif type_ == "branch.renamed" and seq <= at and isinstance(payload.get("name"), str):
            state.names[branch] = payload["name"]
        elif type_ == "branch.archived":
            if seq <= at:
                state.archived[branch] = str(payload.get("reason") or "")
            else:
                state.archived_later.add(branch)
    for seq, type_, job in (Event.objects.filter(session_id=sid, type__startswith="job.").order_by("seq")
                            .annotate(jid=KeyTextTransform("job", "payload")).values_list("seq", "type", "jid")):
        if not job:
            continue
        state.logged_jobs.add(job)
        if seq <= at:
            state.jobs[job] = type_.removeprefix("job.")
    return state
