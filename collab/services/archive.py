"""Archiving a branch (docs/contract.md#archive): a global, one-way flag; history stays.

Archive never cancels running work. Results owed to the mailbox of an idle
archived branch go back to the agents that produced them as failed results
(``bounce_stranded_locked``): no turn will ever read them. The first
``archived_at`` is kept; a manual reason fills in only where none was recorded;
automatic archiving (``archive_when_done``) only fills unset fields.
"""

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from collab.events import send_event_on_commit
from collab.models import Branch
from collab.text import clean_text
from collab.services.followup import bounce_stranded_locked
from collab.services.locking import lock_branch, lock_session


AUTOMATIC_REASON = "archive_when_done"


def do_archive_branch(branch: Branch, *, user=None, reason: str = "", automatic: bool = False) -> Branch:
    """Archive idempotently. Authorization is the caller's job (``collab.access.require_can_archive``)."""
    reason = clean_text((reason or "").strip())[:500]
    now = timezone.now()
    with transaction.atomic():
        lock_session(branch.session_id)  # its log gets the event: session before branch (locking.py)
        first = Branch.objects.filter(pk=branch.pk, archived=False).update(
            archived=True, archived_at=now, archive_reason=reason, archived_by=user
        )
        if not first and reason and not automatic:
            # the first *manual* reason is kept: it fills an empty or automatic reason, never another manual one
            Branch.objects.filter(Q(archive_reason="") | Q(archive_reason=AUTOMATIC_REASON), pk=branch.pk).update(
                archive_reason=reason
            )
        branch.refresh_from_db()
        # results owed to its mailbox that no turn will read now go back to their senders
        bounce_stranded_locked(lock_branch(branch.pk))
        send_event_on_commit(
            branch.session_id, "branch.archived",
            {"branch": branch.pk, "name": branch.name, "archived_at": branch.archived_at.isoformat(),
             "reason": branch.archive_reason, "automatic": automatic, "first": bool(first)},
            actor=user,
        )
    return branch

