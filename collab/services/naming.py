"""Branch naming stage 2 (docs/contract.md#names): a better title from the model at turns {1, 6, 16, 40}.

Only names derived automatically (a prompt label or an earlier auto title) are
replaced; a name given explicitly (description, task_name, a person) is never
overwritten, so addresses by name keep working. The model is asked by the runtime
(``collab.runtime.naming``), between ``naming_input`` and ``do_apply_auto_title``.
"""

from django.db import transaction

from collab.brokers import hand_to_broker
from collab.events import send_event_on_commit
from collab.models import Branch, NameStage, effective_spec
from collab.services.locking import lock_session
from collab.text import fit_text

NAME_BRANCH = "collab.tasks.name_branch"
NAMING_TURNS = frozenset({1, 6, 16, 40})
RENAMABLE = (NameStage.NONE, NameStage.LABEL, NameStage.AUTO)


def schedule_naming(branch_id: str, turns: int, name_stage: int) -> None:
    """Precondition: inside the transaction that brought the branch to ``turns`` turns."""
    if turns not in NAMING_TURNS or name_stage not in RENAMABLE:
        return
    hand_to_broker(NAME_BRANCH, branch_id, task_name=f"name-{branch_id}-{turns}")


def naming_input(branch_id: str):
    """(branch, AgentSpec, the first 20 messages the title is asked from) when ``branch_id`` may
    still be renamed automatically and has a turn to be named after; None otherwise."""
    branch = Branch.objects.select_related("tip", "agent_spec", "session__agent_spec").filter(pk=branch_id).first()
    if branch is None or branch.name_stage not in RENAMABLE or branch.tip is None:
        return None
    return branch, effective_spec(branch), list(branch.messages.order_by("depth")[:20])


def do_apply_auto_title(branch: Branch, title: str | None) -> Branch:
    """Rename ``branch`` to the model's ``title`` (bounded), unless it was named explicitly meanwhile."""
    title = fit_text((title or "").strip(), 100)
    if not title or title == branch.name:
        return branch
    branch_id = branch.pk
    with transaction.atomic():
        lock_session(branch.session_id)  # its log gets the event: session before branch (locking.py)
        renamed = Branch.objects.filter(pk=branch_id, name_stage__in=RENAMABLE).update(name=title, name_stage=NameStage.AUTO)
        if renamed:
            send_event_on_commit(branch.session_id, "branch.renamed", {"branch": branch_id, "old": branch.name, "name": title})
    branch.refresh_from_db()
    return branch
