"""Creating branches (the agents) and giving them their first name (docs/contract.md#names)."""

import re

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from collab.access import require_can_set_internal
from collab.dag_layout import pick_lane
from collab.errors import Invalid
from collab.events import deferred_event, send_event_on_commit
from collab.models import Branch, Job, NameStage, format_address
from collab.services.locking import lock_session
from collab.text import fit_text

LABEL_CHARS = 24
MAX_LANE = 32767  # the column's range; every lane past the DAG's cap (8) is drawn folded anyway


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
                  created_by_job=None, parent_branch=None, task_name=None, near=None, session_locked: bool = False,
                  events: list | None = None) -> Branch:
    """Precondition: inside ``transaction.atomic``; the caller has authorized the session.
    ``near``: the branch that opens this one (a spawn's caller), whose lane the new one sits beside.
    ``session_locked``: the caller holds the session's row lock already. ``events``: a list its
    ``branch.created`` is added to, for the caller to send with the session's next events in one
    statement (``collab.events.send_events_on_commit``)."""
    name = fit_text(name, 100)
    if not session_locked:
        lock_session(session.pk)  # lanes of one session are chosen one at a time
    lane = open_lane(session.pk, forked_from=forked_from, created_by_job=created_by_job,
                     parent_branch=parent_branch or near)
    branch = Branch.objects.create(
        session=session, name=name, name_stage=name_stage, forked_from=forked_from, agent_spec=agent_spec,
        created_by=created_by, created_by_job=created_by_job, parent_branch=parent_branch, task_name=task_name,
        lane=lane,
    )
    payload = {
        "branch": branch.pk,
        "name": name,
        "name_stage": name_stage,
        "forked_from": format_address(forked_from.session_id, forked_from.pk) if forked_from else None,
        "job": getattr(created_by_job, "pk", None),
    }
    if events is None:
        send_event_on_commit(session.pk, "branch.created", payload, actor=created_by)
    else:
        events.append(deferred_event("branch.created", payload, created_by))
    return branch


def open_lane(session_id: str, *, forked_from=None, created_by_job=None, parent_branch=None) -> int:
    """The DAG lane of a branch opening now: the free lane nearest its parent's.

    Its parent is the branch it forks from, else the branch whose job spawned it, else the
    branch that opened it (OpenWork parent, or a spawn's caller without a job: a gateway call) —
    when that one is in the same session (a branch opened in another session
    starts near lane 0). A lane is taken while its branch can still write rows: not archived, or
    archived with a turn still open (archive never cancels a running turn). Once archived and idle,
    a branch writes nothing more, so a later branch may reuse its column below its last row.
    Precondition: the session row is locked, so two branches opening at once never share a lane.
    """
    def lane_of(branch_id):  # a lane never changes once chosen: the opener's in memory is read as is
        if parent_branch is not None and parent_branch.pk == branch_id:
            return parent_branch.lane
        return Branch.objects.filter(pk=branch_id).values_list("lane", flat=True).first()

    parent = None
    if forked_from is not None and forked_from.session_id == session_id:
        parent = lane_of(forked_from.branch_id)
    if parent is None and created_by_job is not None and created_by_job.session_id == session_id:
        parent = lane_of(created_by_job.branch_id)
    if parent is None and parent_branch is not None and parent_branch.session_id == session_id:
        parent = parent_branch.lane
    busy = Job.objects.open().filter(branch=OuterRef("pk"))
    taken = Branch.objects.filter(session_id=session_id).filter(Q(archived=False) | Exists(busy))
    return min(pick_lane(set(taken.values_list("lane", flat=True)), parent), MAX_LANE)


def do_set_internal(user, branch: Branch, internal: bool) -> bool:
    """A person (maintainer or owner of the branch's session) marks it internal or not
    (hidden from agents); audited as ``branch.internal_changed``. True if it changed."""
    require_can_set_internal(user, branch)
    return do_set_branch_internal(user, branch, internal)


def do_set_branch_internal(actor, branch: Branch, internal: bool) -> bool:
    """Flag a branch internal (hidden from agents' listings and name resolution) or not; audited
    as ``branch.internal_changed``. True if it changed. Authorization is the caller's: an
    operator's Django permission in the admin, ``do_set_internal`` for project members."""
    if not isinstance(internal, bool):
        raise Invalid("internal must be true or false", code="invalid_internal")
    with transaction.atomic():
        lock_session(branch.session_id)  # its log gets the event: session before branch (locking.py)
        changed = Branch.objects.filter(pk=branch.pk).exclude(internal=internal).update(internal=internal)
        if changed:
            send_event_on_commit(branch.session_id, "branch.internal_changed",
                                 {"branch": branch.pk, "internal": internal}, actor=actor)
    return bool(changed)
