"""What the session page shows of turns that wait for a person (docs/web-app.md#inbox): the
session's pending asks by the tool call they stop at, whether the viewer may decide each, and
the spec each open turn runs with (which of its calls may still stop for a person)."""

from django.db.models import Exists, OuterRef

from collab.access import decidable_asks
from collab.models import AskStatus, Job, PersonAsk


def waiting_calls(user, session_id: str) -> dict[tuple[str, int], dict]:
    """``{(call_message_id, call_index): {"ask", "kind", "yours"}}`` for the pending asks of the
    session (``yours``: ``user`` may decide it, so the inbox lists it for them). One query.
    Preconditions: ``user`` may see the session."""
    yours = Exists(decidable_asks(user).filter(pk=OuterRef("pk")))
    rows = (PersonAsk.objects.filter(session_id=session_id, status=AskStatus.PENDING).annotate(yours=yours)
            .values_list("call_message_id", "call_index", "pk", "kind", "yours"))
    return {(message, index): {"ask": pk, "kind": kind, "yours": bool(mine)}
            for message, index, pk, kind, mine in rows}


def open_turn_specs(session_id: str) -> dict:
    """``{job_id: agent spec or None}`` for the session's open turns (queued, running, stopping,
    waiting): the spec whose ``approvals`` say which of a turn's calls will wait. One query."""
    jobs = Job.objects.open().filter(session_id=session_id).select_related("agent_spec").only(
        "pk", "agent_spec__approvals")
    return {job.pk: job.agent_spec for job in jobs}
