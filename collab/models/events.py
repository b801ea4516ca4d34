from django.conf import settings
from django.db import models
from django.utils import timezone


class Event(models.Model):
    """Append-only, per-session ordered log (OP §3): the audit trail and the source of live updates."""

    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="event_seq_unique_per_session")]
        indexes = [models.Index(fields=["type", "created_at"], name="event_type_created")]

    def as_wire(self) -> dict:
        return {"seq": self.seq, "type": self.type, "payload": self.payload, "created_at": self.created_at.isoformat()}
