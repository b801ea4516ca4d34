from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone



class HoldStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class HeldDelivery(models.Model):
    """A delivery (``send_message`` or ``agent(to=…)``) held by the project's watch policy
    until a member approves or rejects it (docs/contract.md#watch-policy). Sub-agents pass the same gate."""

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="held_deliveries")
    kind = models.CharField(max_length=16)  # "message" | "task"
    text = models.TextField()
    target_branch = models.ForeignKey("collab.Branch", on_delete=models.CASCADE, related_name="+")
    sender_session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="held_deliveries")
    sender_branch = models.ForeignKey("collab.Branch", on_delete=models.CASCADE, related_name="+")
    sender_job = models.ForeignKey("collab.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=16, choices=HoldStatus.choices, default=HoldStatus.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    result_job = models.ForeignKey("collab.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        verbose_name_plural = "held deliveries"
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=["message", "task"]), name="hold_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=HoldStatus.values), name="hold_status_valid"),
            models.CheckConstraint(
                condition=Q(status=HoldStatus.PENDING) | Q(decided_at__isnull=False), name="hold_decided_has_time"
            ),
        ]
