from django.db import models
from django.db.models import Q
from django.utils import timezone

from collab.models.ids import id_field


class Artifact(models.Model):
    """The full text of a truncated result (docs/contract.md#results), readable like its execution."""

    id = id_field()
    job = models.ForeignKey("collab.Job", on_delete=models.CASCADE, related_name="artifacts")
    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="artifacts")
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="artifacts")
    media_type = models.CharField(max_length=100, default="text/plain; charset=utf-8")
    content = models.TextField()
    size_bytes = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(size_bytes__gte=0), name="artifact_size_nonneg"),
        ]
