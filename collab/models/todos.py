from django.db import models
from django.db.models import Q
from django.utils import timezone



class TodoStatus(models.TextChoices):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class Todo(models.Model):
    """A plan item; never starts anything."""

    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="todos")
    branch = models.ForeignKey("collab.Branch", null=True, blank=True, on_delete=models.CASCADE, related_name="todos")
    subject = models.CharField(max_length=300)
    description = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=TodoStatus.choices, default=TodoStatus.PENDING)
    blocked_by = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="blocks")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.CheckConstraint(condition=Q(status__in=TodoStatus.values), name="todo_status_valid")]
