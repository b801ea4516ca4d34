from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from collab.models.ids import id_field


class AskKind(models.TextChoices):
    APPROVAL = "approval"  # a tool call the spec's ``approvals`` name: run it, edited or not, or reject it
    QUESTION = "question"  # ``ask_person``: the answer is the tool's result


class AskStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    ANSWERED = "answered"
    EXPIRED = "expired"  # past ``expires_at`` undecided: the call's result is ``rejected: expired``
    CLOSED = "closed"  # its turn ended otherwise (cancelled, failed) before anyone decided


class AskRule(models.TextChoices):
    """Which rule made an approval's call wait: the agent spec's ``approvals`` or the project's."""

    SPEC = "spec"
    PROJECT = "project"


DECIDED_STATUSES = (AskStatus.APPROVED, AskStatus.REJECTED, AskStatus.ANSWERED, AskStatus.EXPIRED)


class PersonAsk(models.Model):
    """One tool call of a turn that waits for a person (docs/contract.md#people-in-the-loop): an
    approval of a call the agent's spec names, or an ``ask_person`` question. Its turn waits
    (``JobStatus.WAITING``) holding no worker slot; the decision resumes it once. One per tool call."""

    id = id_field()
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="asks")
    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="asks")
    branch = models.ForeignKey("collab.Branch", on_delete=models.CASCADE, related_name="asks")
    job = models.ForeignKey("collab.Job", on_delete=models.CASCADE, related_name="asks")
    call_message = models.ForeignKey("collab.Message", on_delete=models.CASCADE, related_name="+")
    call_index = models.PositiveIntegerField()  # which of the node's tool calls
    tool_call_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=AskKind.choices)
    # an approval's: whose ``approvals`` named the tool (the spec's, when both did); "" for a question
    rule = models.CharField(max_length=16, choices=AskRule.choices, blank=True, default="")
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict, blank=True)
    question = models.TextField(blank=True, default="")
    choices = models.JSONField(default=list, blank=True)
    to_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="asks_to_me")
    status = models.CharField(max_length=16, choices=AskStatus.choices, default=AskStatus.PENDING)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    # what the decision says: {"arguments": {…}} (approved, edited), {"reason": "…"}, {"answer": "…"}
    decision = models.JSONField(default=dict, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # what the turn's provider needs to go on where it stopped (the scripted provider's cursor)
    provider_state = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "tool_call_id"], name="ask_one_per_tool_call"),
            models.CheckConstraint(condition=Q(kind__in=AskKind.values), name="ask_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=AskStatus.values), name="ask_status_valid"),
            models.CheckConstraint(condition=Q(rule="") | Q(kind=AskKind.APPROVAL, rule__in=AskRule.values),
                                   name="ask_rule_of_an_approval"),
            # a decided item says who and when (an expired or closed one: when)
            models.CheckConstraint(condition=Q(status=AskStatus.PENDING) | Q(decided_at__isnull=False),
                                   name="ask_decided_has_time"),
        ]
        indexes = [
            models.Index(fields=["project", "created_at"], condition=Q(status="pending"), name="ask_pending"),
            models.Index(fields=["expires_at"], condition=Q(status="pending", expires_at__isnull=False),
                         name="ask_pending_expiry"),
        ]

    def __str__(self):
        return f"{self.kind} {self.pk} ({self.status})"
