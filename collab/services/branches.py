"""Creating branches (the agents) and naming them (OP §2.4 stage 1)."""

import re

from django.db import transaction

from collab.events import send_event_on_commit
from collab.models import Branch, NameStage
from collab.services.locking import lock_session
from collab.text import fit_text

LABEL_CHARS = 24


def label_from(prompt: str) -> str:
    """A short readable label from a prompt: its first line, collapsed, at most 24 characters."""
    first = next((line for line in prompt.strip().splitlines() if line.strip()), "")
    words = re.sub(r"\s+", " ", first).strip()
    if len(words) <= LABEL_CHARS:
        return words or "agent"
    cut = words[: LABEL_CHARS - 1]  # leave room for the ellipsis: at most 24 characters in all
    if " " in cut[LABEL_CHARS // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip(" ,.;:-") + "…"


def name_for(description: str, prompt: str) -> tuple[str, int]:
    """An explicit description wins and is never renamed; otherwise a label from the prompt."""
    description = (description or "").strip()
    if description:
        return fit_text(description, 100), NameStage.MANUAL
    return label_from(prompt), NameStage.LABEL


def create_branch(session, *, name: str, name_stage: int, forked_from=None, agent_spec=None, created_by=None,
                  created_by_job=None, parent_branch=None, task_name=None) -> Branch:
    """Precondition: inside ``transaction.atomic``; the caller has authorized the session."""
    name = fit_text(name, 100)
    branch = Branch.objects.create(
        session=session, name=name, name_stage=name_stage, forked_from=forked_from, agent_spec=agent_spec,
        created_by=created_by, created_by_job=created_by_job, parent_branch=parent_branch, task_name=task_name,
    )
    send_event_on_commit(
        session.pk,
        "branch.created",
        {
            "branch": branch.pk,
            "name": name,
            "name_stage": name_stage,
            "forked_from": f"{forked_from.session_id}:{forked_from.pk}" if forked_from else None,
            "job": getattr(created_by_job, "pk", None),
        },
        actor=created_by,
    )
    return branch


def do_set_branch_internal(actor, branch: Branch, internal: bool) -> bool:
    """Flag a branch internal (hidden from agents' listings) or not; audited. True if it changed.
    Authorization is the caller's (an operator's Django permission in the admin)."""
    with transaction.atomic():
        lock_session(branch.session_id)  # its log gets the event: session before branch (locking.py)
        changed = Branch.objects.filter(pk=branch.pk).exclude(internal=internal).update(internal=internal)
        if changed:
            send_event_on_commit(branch.session_id, "branch.internal_changed",
                                 {"branch": branch.pk, "internal": internal}, actor=actor)
    return bool(changed)
