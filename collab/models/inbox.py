from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now



class InboxKind(models.TextChoices):
    MESSAGE = "message"
    TASK = "task"


class InboxEntry(models.Model):
    """A delivery persisted for a busy target (docs/contract.md#the-inbox), drained FIFO when its turn ends."""

    target_branch = models.ForeignKey("collab.Branch", on_delete=models.CASCADE, related_name="inbox")
    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="inbox")
    kind = models.CharField(max_length=16, choices=InboxKind.choices, default=InboxKind.MESSAGE)
    text = models.TextField()
    sender_session = models.ForeignKey(
        "collab.Session", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sender_branch = models.ForeignKey("collab.Branch", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    sender_address = models.CharField(max_length=100, blank=True, default="")
    sender_job = models.ForeignKey("collab.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    chain_messages = models.PositiveIntegerField(default=0)
    chain_generations = models.PositiveIntegerField(default=0)
    # the database's clock: FIFO order and the 60-s duplicate window hold across app servers
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "inbox entries"
        indexes = [models.Index(fields=["target_branch", "created_at"], name="inbox_target_fifo")]
        constraints = [models.CheckConstraint(condition=Q(kind__in=InboxKind.values), name="inbox_kind_valid")]
