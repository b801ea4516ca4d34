"""The audit of agents' list queries: every ``list_agents`` call is logged (``agents.listed``)."""

from django.db import transaction

from collab.events import send_event_on_commit


def do_record_agents_listed(session_id: str, *, user, by: str, scope: str, session_ids: list[str]) -> None:
    """Record that the agent at ``by`` listed agents (``agents.listed`` in its session). The ids
    of the sessions it was shown let a reader's count leave out those the reader may not see
    (``collab.selectors.redact``); nothing else of the listing is kept."""
    with transaction.atomic():
        send_event_on_commit(session_id, "agents.listed", {
            "scope": scope, "by": by, "sessions": len(session_ids), "session_ids": session_ids}, actor=user)
