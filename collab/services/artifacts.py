"""Full texts of truncated results (docs/contract.md#results)."""

import hashlib
import logging
from datetime import timedelta

from django.db import DatabaseError, transaction
from django.utils import timezone

from collab.models import Artifact
from collab.text import RESULT_LIMIT, bound_text, clean_text

log = logging.getLogger(__name__)


def store_result(job, text: str, limit: int = RESULT_LIMIT) -> tuple[str, Artifact | None]:
    """The bounded summary of ``text`` and, when it had to be cut, the Artifact holding
    the whole. If the Artifact cannot be written the summary says so and no reference
    is returned — never a reference to nothing. The text passes the text boundary first."""
    text = clean_text(text or "")
    if len(text) <= limit:
        return text, None
    summary, _ = bound_text(text, limit - 120)  # room for the reference line
    data = text.encode("utf-8")
    try:
        with transaction.atomic():
            artifact = Artifact.objects.create(
                job=job, session_id=job.session_id, project_id=job.project_id,
                media_type="text/plain; charset=utf-8", content=text, size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                expires_at=timezone.now() + timedelta(days=job.project.artifact_retention_days),
            )
    except DatabaseError:
        log.exception("could not store the full result of %s", job.pk)
        return summary + "\n[the full text could not be stored]", None
    return summary + f"\n[full text: artifact {artifact.pk}, {len(data)} bytes]", artifact


def cleanup_expired_artifacts(now=None, project=None) -> int:
    """Delete artifacts past their retention (only those; optionally of one project)."""
    qs = Artifact.objects.filter(expires_at__lt=now or timezone.now())
    if project is not None:
        qs = qs.filter(project=project)
    count, _ = qs.delete()
    return count
