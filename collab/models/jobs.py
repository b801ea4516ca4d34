from django.conf import settings
from django.db import models
from django.db.models import Case, OuterRef, Q, Subquery, When
from django.db.models.functions import Now
from django.utils import timezone

from collab.models.ids import id_field
from collab.models.sessions import Message, MessageRole
from collab.infra.prepared import Param, Select


class JobKind(models.TextChoices):
    """Why the turn runs; also the key of a scripted AgentSpec's per-kind steps
    (docs/contract.md#the-scripted-provider)."""

    USER = "user"
    SPAWN = "spawn"
    TASK = "task"  # agent(to=…) delegation
    MESSAGE = "message"  # send_message
    FOLLOWUP = "followup"


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    # paused for a person (docs/contract.md#people-in-the-loop): holds no worker slot, no lease;
    # a decision queues it again and it resumes where it stopped
    WAITING = "waiting"


ACTIVE_STATUSES = (JobStatus.RUNNING, JobStatus.STOPPING)
OPEN_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.STOPPING, JobStatus.WAITING)
HOLDING_STATUSES = (*ACTIVE_STATUSES, JobStatus.WAITING)
TERMINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED)

# What a person's turn does when its branch is busy (``collab.services.turns``).
STRATEGIES = ("enqueue", "reject", "interrupt", "rollback")
CANCEL = "execution.cancel"  # the one action of an execution command (``collab.services.cancel``)
MAX_PROMPT_CHARS = 200_000  # a person's prompt (``collab.services.admission.check_prompt``)




class JobQuerySet(models.QuerySet):
    """The two "is this branch taken" rules, each written once:

    - ``running()``: a turn is in progress (running, or stopping after a cancel). A branch with
      one is *busy*: the ``busy`` flag of the API's and pages' branch rows and of ``list_agents``,
      what double-texting strategies act on, what keeps an archived branch's mailbox undrained.
    - ``open()``: admitted and not ended (queued too). A branch with one is *occupied*: a new
      delivery waits in its inbox rather than admitting a second job, its
      graph lane is kept, its sub-agent status is not idle.
    """

    def running(self):
        return self.filter(status__in=ACTIVE_STATUSES)

    def open(self):
        return self.filter(status__in=OPEN_STATUSES)

    def holding(self):
        """A turn is in progress on the branch or waits there for a person
        (docs/contract.md#people-in-the-loop): no other job of the branch may start."""
        return self.filter(status__in=HOLDING_STATUSES)

    def with_result(self):
        """Each job read with its ``result`` (``Job.result``): the final answer's text comes in
        the same query, for the jobs whose result it is — a listing reads no row per job."""
        return self.annotate(final_answer=Case(When(result_text__isnull=True, then=Subquery(
            final_answers(job=OuterRef("pk")).values("text")[:1]))))


def final_answers(**where):
    """The final answer nodes (``finish_job``'s ``final`` assistant node, one per job at most)."""
    return Message.objects.filter(role=MessageRole.ASSISTANT, metadata__final=True, **where).order_by()


def is_busy(branch) -> bool:
    """A turn is running (or stopping) on ``branch`` (``JobQuerySet.running``)."""
    return _ANY_ON_BRANCH.first("running", branch=branch.pk) is not None


def is_occupied(branch) -> bool:
    """``branch`` has a job admitted and not ended, queued included (``JobQuerySet.open``)."""
    return _ANY_ON_BRANCH.first("open", branch=branch.pk) is not None


# one job of the branch in those statuses, or none: every admission and completion asks
# (compiled once per process and shape: collab.infra.prepared)
_ANY_ON_BRANCH = Select("any_job_on_branch", lambda statuses: getattr(Job.objects, statuses)()
                        .filter(branch_id=Param("branch")).order_by().values_list("pk", flat=True)[:1])


class FollowupState(models.TextChoices):
    NONE = "none"  # nobody is waiting for this result
    OWED = "owed"  # committed with the terminal state; delivered exactly once later
    DELIVERED = "delivered"


class Job(models.Model):
    """The canonical execution: ``execution_id == Job.id``.

    Every state change bumps ``version`` (the cancel command's optimistic check).
    The executing side is (session, branch, parent_msg); the caller side
    (caller_session, caller_msg, caller_branch) is where the result goes back.
    """

    id = id_field()
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="jobs")
    # session, branch, caller_branch: no index of their own, job_session_status, job_branch_status and
    # job_caller_followup lead with them
    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="jobs", db_index=False)
    branch = models.ForeignKey("collab.Branch", on_delete=models.CASCADE, related_name="jobs", db_index=False)
    agent_spec = models.ForeignKey("collab.AgentSpec", null=True, blank=True, on_delete=models.SET_NULL)
    kind = models.CharField(max_length=16, choices=JobKind.choices)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    version = models.PositiveIntegerField(default=1)

    # the prompt as admitted, until the turn's prompt node holds it: NULL from then on (the node is
    # written with the job row by an idle branch's admission, or by the claim that clears this), so
    # the text is stored once. ``prompt_text`` reads either.
    prompt = models.TextField(null=True, blank=True, default="")
    prompt_header = models.CharField(max_length=300, blank=True, default="")
    parent_msg = models.ForeignKey(
        "collab.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the predecessor the turn was admitted at",
    )
    prompt_msg = models.ForeignKey(
        "collab.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # the caller side, the parent job and the result artifact are NULL for a person's turn (most
    # turns): each is indexed only where it is set (Meta.indexes: ``job_caller_*``, ``job_parent_job``,
    # ``job_result_artifact``), which every lookup by them — an equality or ``IN``, the cascades and
    # the database's foreign-key checks — implies (a plain index would store an entry
    # per turn for the NULLs). ``followup_of``'s is ``job_one_followup_per_job``.
    caller_session = models.ForeignKey(
        "collab.Session", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    caller_msg = models.ForeignKey(
        "collab.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    caller_branch = models.ForeignKey(
        "collab.Branch", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    caller_job = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    parent_job = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children", db_index=False
    )
    followup_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False,
        help_text="for a follow-up turn: the finished job whose result it carries",
    )
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the person whose permissions the turn acts with (root turn's starter)",
    )

    run_in_background = models.BooleanField(
        default=True, help_text="handed to the worker queue (an inline foreground child runs in its caller's turn instead)",
    )
    answers_call = models.BooleanField(
        default=False,
        help_text="a foreground agent call from outside a turn (tool gateway, MCP) waits for this job and answers "
                  "with its result: it runs on a worker like a background job, and no follow-up carries its result",
    )
    archive_when_done = models.BooleanField(default=False)
    chain_messages = models.PositiveIntegerField(default=0)
    chain_generations = models.PositiveIntegerField(default=0)

    # the bounded result (docs/contract.md#results); NULL when it is the whole text of the job's final answer, which
    # holds it once. ``result`` reads either.
    result_text = models.TextField(null=True, blank=True, default="")
    result_artifact = models.ForeignKey(
        "collab.Artifact", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    is_error = models.BooleanField(default=False)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_reason = models.TextField(blank=True, default="")

    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    model_calls = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)

    worker = models.CharField(max_length=100, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # a queued job whose claim was declined because its project was at its running cap:
    # since when it waits for a worker slot. Set by the declined claim, cleared by the completion
    # that hands it back to the queue (collab.services.fair_share); meaningless once it left queued
    waiting_since = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    followup_state = models.CharField(max_length=16, choices=FollowupState.choices, default=FollowupState.NONE)
    followup_mode = models.CharField(max_length=16, blank=True, default="")
    # W3C trace context (``traceparent``, then ``;`` and ``tracestate`` when there is one) of the
    # span this execution's work joins: its caller's, so a child on another worker stays in its
    # parent's trace (docs/operations.md#traces); empty when tracing is off
    trace_context = models.CharField(max_length=512, blank=True, default="")

    # the database's clock: the claim order of a branch's queued jobs never depends
    # on which app server admitted them
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["branch", "status", "created_at"], name="job_branch_status"),
            models.Index(fields=["caller_branch", "followup_state"], condition=Q(caller_branch__isnull=False),
                         name="job_caller_followup"),
            models.Index(fields=["session", "status"], name="job_session_status"),
            # whether a branch has an open job (every admission and completion asks: is_occupied):
            # the branch's open jobs alone, however long its history and the queue
            models.Index(fields=["branch"], condition=Q(status__in=OPEN_STATUSES), name="job_open_on_branch"),
            # what reads jobs by status alone looks for open ones (the reconciler's expired leases and
            # stale queued jobs): an ended job leaves this index
            models.Index(fields=["status", "lease_expires_at"], condition=Q(status__in=OPEN_STATUSES),
                         name="job_status_lease"),
            # the jobs a freed worker slot may wake (fair_share.wake_waiting_in_project), oldest first:
            # only the queued ones a claim declined for the cap, a handful, whatever the queue holds
            models.Index(fields=["project", "created_at"], condition=Q(waiting_since__isnull=False, status=JobStatus.QUEUED),
                         name="job_waiting_for_slot"),
            # the queued jobs a contended worker slot picks from (fair_share.fairest_queued_job): the
            # worker queue's jobs not waiting for their project's cap, by project, oldest first
            models.Index(fields=["project", "created_at"],
                         condition=Q(status=JobStatus.QUEUED, run_in_background=True, waiting_since__isnull=True),
                         name="job_queued_for_slot"),
            models.Index(fields=["caller_session"], condition=Q(caller_session__isnull=False), name="job_caller_session"),
            models.Index(fields=["caller_msg"], condition=Q(caller_msg__isnull=False), name="job_caller_msg"),
            models.Index(fields=["caller_job"], condition=Q(caller_job__isnull=False), name="job_caller_job"),
            models.Index(fields=["parent_job"], condition=Q(parent_job__isnull=False), name="job_parent_job"),
            models.Index(fields=["result_artifact"], condition=Q(result_artifact__isnull=False),
                         name="job_result_artifact"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=JobStatus.values), name="job_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=JobKind.values), name="job_kind_valid"),
            models.CheckConstraint(condition=Q(followup_state__in=FollowupState.values), name="job_followup_valid"),
            models.CheckConstraint(condition=Q(version__gte=1), name="job_version_positive"),
            models.CheckConstraint(
                condition=Q(status__in=TERMINAL_STATUSES, finished_at__isnull=False)
                | (~Q(status__in=TERMINAL_STATUSES) & Q(finished_at__isnull=True)),
                name="job_finished_iff_terminal",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=ACTIVE_STATUSES) | Q(started_at__isnull=False),
                name="job_active_has_started",
            ),
            # a queued job has not started, unless it is queued again after waiting for a person
            # (docs/contract.md#people-in-the-loop): it has spoken to its model already
            models.CheckConstraint(
                condition=Q(status=JobStatus.QUEUED, started_at__isnull=True) | ~Q(status=JobStatus.QUEUED)
                | Q(model_calls__gt=0),
                name="job_queued_not_started",
            ),
            models.UniqueConstraint(
                fields=["branch"], condition=Q(status__in=ACTIVE_STATUSES), name="job_one_active_per_branch"
            ),
            models.UniqueConstraint(
                fields=["followup_of"], condition=Q(followup_of__isnull=False), name="job_one_followup_per_job"
            ),
        ]

    def __str__(self):
        return f"{self.id} {self.kind} {self.status}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def prompt_text(self) -> str:
        """The turn's prompt as admitted (the scripted provider's ``{{prompt}}``): ``prompt`` until the prompt
        node is written, then that node's text without the header written for the model (read
        from the node, unless the claim loaded it with the job)."""
        if self.prompt is not None:
            return self.prompt
        node = self.prompt_msg
        if node is None:  # its session is being deleted
            return ""
        return node.text[len(self.prompt_header) + 2:] if self.prompt_header else node.text

    @property
    def result(self) -> str:
        """The job's bounded result (the API's ``result``, ``job_output``, follow-ups; docs/contract.md#results):
        ``result_text``, or the final answer's text when that is all of it — read with the job by
        ``Job.objects.with_result()``, else once here, on first use."""
        if self.result_text is not None:
            return self.result_text
        answer = self.__dict__.get("final_answer")
        if answer is None:
            answer = final_answers(job_id=self.pk).values_list("text", flat=True).first() or ""
            self.final_answer = answer
        return answer


class ExecutionCommand(models.Model):
    """An idempotent control command (docs/contract.md#cancel): repeating ``command_id`` returns the first answer."""

    command_id = models.CharField(max_length=120, primary_key=True, help_text="EXECUTION_ID:client command id")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="commands")
    action = models.CharField(max_length=32)
    expected_version = models.PositiveIntegerField()
    payload = models.JSONField(default=dict, blank=True)
    response_status = models.PositiveSmallIntegerField()
    response = models.JSONField(default=dict)
    issued_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(action__in=["execution.cancel"]), name="command_action_valid"),
        ]
