from django.conf import settings
from django.db import models
from django.utils import timezone



class Event(models.Model):
    """Append-only, per-session ordered log (docs/contract.md#events): the audit trail and the source of live updates.

    Project-level events (memberships, limits) have no session; their ``seq`` counts
    in the project's own sequence.
    """

    # no index of their own: (project, created_at) and (session, seq) below lead with them
    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="events", db_index=False
    )
    session = models.ForeignKey(
        "collab.Session", null=True, blank=True, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    # indexed where set (event_actor): most events have no actor
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, db_index=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="event_seq_unique_per_session"),
            models.UniqueConstraint(
                fields=["project", "seq"], condition=models.Q(session__isnull=True), name="event_seq_unique_per_project"
            ),
        ]
        # Every index costs bytes per event: the audit log's (project, time),
        # the unique (session, seq) of every session read, and the actor's where there is one
        # (a person deleted: SET_NULL). No query filters on type alone (migration 0018).
        indexes = [
            models.Index(fields=["project", "created_at"], name="event_project_created"),
            models.Index(fields=["actor"], condition=models.Q(actor__isnull=False), name="event_actor"),
        ]

    def as_wire(self) -> dict:
        return {"seq": self.seq, "type": self.type, "payload": self.payload, "created_at": self.created_at.isoformat()}
