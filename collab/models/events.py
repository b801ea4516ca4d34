from django.conf import settings
from django.db import models
from django.utils import timezone


class Event(models.Model):
    """Append-only, per-session ordered log (OP §3): the audit trail and the source of live updates.

    Project-level events (memberships, limits) have no session; their ``seq`` counts
    in the project's own sequence.
    """

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="events")
    session = models.ForeignKey("collab.Session", null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="event_seq_unique_per_session"),
            models.UniqueConstraint(
                fields=["project", "seq"], condition=models.Q(session__isnull=True), name="event_seq_unique_per_project"
            ),
        ]
        indexes = [
            models.Index(fields=["type", "created_at"], name="event_type_created"),
            models.Index(fields=["project", "created_at"], name="event_project_created"),
        ]

    def as_wire(self) -> dict:
        return {"seq": self.seq, "type": self.type, "payload": self.payload, "created_at": self.created_at.isoformat()}
