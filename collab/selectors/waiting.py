"""What the session page shows of turns that wait for a person (docs/web-app.md#inbox): the
session's pending asks by the tool call they stop at, whether the viewer may decide each, and
the spec each open turn runs with (which of its calls may still stop for a person)."""

from django.db.models import Exists, OuterRef

from collab.access import decidable_asks
from collab.models import AskKind, AskStatus, Job, PersonAsk
from collab.selectors.inbox import ask_item, redacted_items


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


def asks_at_rows(user, session_id: str, message_ids) -> tuple[dict[str, dict], list[dict]]:
    """The pending asks stopped at the tool-call rows ``message_ids`` of the session (the graph's
    waiting nodes): ``({call_message_id: {"ask", "kind", "yours"}}, items)`` — ``items`` are the
    ones ``user`` may decide, each as the inbox shows it (its free text redacted for them), with
    the ``node`` it waits at. One query (and the redaction's, only when a text names an id).
    Preconditions: ``user`` may see the session."""
    yours = Exists(decidable_asks(user).filter(pk=OuterRef("pk")))
    asks = list(PersonAsk.objects.filter(session_id=session_id, status=AskStatus.PENDING,
                                         call_message_id__in=list(message_ids))
                .annotate(yours=yours)
                .select_related("project", "session", "branch", "job__agent_spec", "to_user")
                .order_by("created_at", "pk"))
    nodes: dict[str, dict] = {}
    for ask in asks:
        nodes.setdefault(ask.call_message_id, {"ask": ask.pk, "kind": ask.kind, "yours": bool(ask.yours)})
    items = redacted_items(user, [{**ask_item(ask), "node": ask.call_message_id} for ask in asks if ask.yours])
    return nodes, items


def open_questions(user, session_id: str) -> list[dict]:
    """The ``ask_person`` questions waiting in the session that ``user`` may answer, oldest
    first, each as the inbox shows it (an MCP client's elicitations: ``collab.mcp_server``).
    One query (and the redaction's, only when a text names an id)."""
    asks = (decidable_asks(user).filter(session_id=session_id, status=AskStatus.PENDING, kind=AskKind.QUESTION)
            .select_related("project", "session", "branch", "job__agent_spec", "to_user").order_by("created_at", "pk"))
    return redacted_items(user, [ask_item(ask) for ask in asks])
