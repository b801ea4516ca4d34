"""What waits for a person (docs/api.md#inbox): the asks they may decide and the held
deliveries they may approve, across every project and session they may see, oldest first."""

from accounts.policy import project_ids_with
from collab.access import DECIDE_HOLDS, decidable_asks, visible_session_ids
from collab.models import AskStatus, HeldDelivery, HoldStatus
from collab.selectors.redact import redact_texts

HOLD_PREFIX = "hold-"  # a held delivery's item id: its own ids are numbers, an ask's are hex
MAX_ITEMS = 500


def ask_payload(ask) -> dict:
    """An ask as events and webhooks carry it (the inbox's item, docs/api.md#inbox)."""
    return {"ask": ask.pk, "kind": ask.kind, "rule": ask.rule or None, "job": ask.job_id, "branch": ask.branch_id,
            "tool": ask.tool,
            "arguments": ask.arguments, "question": ask.question, "choices": ask.choices,
            "to": ask.to_user.username if ask.to_user_id else None,
            "expires_at": ask.expires_at.isoformat() if ask.expires_at else None}


def ask_item(ask) -> dict:
    spec = ask.job.agent_spec
    return {
        "id": ask.pk, "kind": ask.kind, "rule": ask.rule or None, "status": ask.status, "project": ask.project.slug,
        "session": ask.session_id, "session_title": ask.session.title, "branch": ask.branch_id,
        "branch_name": ask.branch.display_name, "agent": spec.agent_id if spec is not None else None,
        "execution": ask.job_id, "tool": ask.tool, "arguments": ask.arguments, "question": ask.question,
        "choices": ask.choices, "to": ask.to_user.username if ask.to_user_id else None,
        "created_at": ask.created_at, "expires_at": ask.expires_at,
    }


def hold_item(hold) -> dict:
    spec = hold.sender_job.agent_spec if hold.sender_job_id else None
    return {
        "id": f"{HOLD_PREFIX}{hold.pk}", "kind": "hold", "rule": None, "status": hold.status,
        "project": hold.project.slug,
        "session": hold.sender_session_id, "session_title": hold.sender_session.title,
        "branch": hold.sender_branch_id, "branch_name": hold.sender_branch.display_name,
        "agent": spec.agent_id if spec is not None else None, "execution": hold.sender_job_id,
        "tool": "send_message" if hold.kind == "message" else "agent",
        "arguments": {"to": hold.target_branch.address, ("message" if hold.kind == "message" else "prompt"): hold.text},
        "question": "", "choices": [], "to": None, "created_at": hold.created_at, "expires_at": None,
    }


def inbox_items(user, *, limit: int = MAX_ITEMS) -> list[dict]:
    """The pending items ``user`` may decide, oldest first, each as ``GET /api/inbox`` shows it;
    their free text as the person may read it (``redact_texts``: another session they may not see
    is never named)."""
    limit = max(1, min(limit, MAX_ITEMS))
    asks = list(decidable_asks(user).filter(status=AskStatus.PENDING)
                .select_related("project", "session", "branch", "job__agent_spec", "to_user")
                .order_by("created_at", "pk")[:limit])
    holds = list(HeldDelivery.objects.filter(
        status=HoldStatus.PENDING, project_id__in=project_ids_with(user, DECIDE_HOLDS),
        sender_session_id__in=visible_session_ids(user),
    ).select_related("project", "sender_session", "sender_branch", "target_branch", "sender_job__agent_spec")
        .order_by("created_at", "pk")[:limit])
    items = sorted([*map(ask_item, asks), *map(hold_item, holds)], key=lambda i: i["created_at"])[:limit]
    return redacted_items(user, items)


def redacted_items(user, items: list[dict]) -> list[dict]:
    """Items' free text (arguments, question, choices) as ``user`` may read it."""
    texts = [[i["arguments"], i["question"], i["choices"]] for i in items]
    scrubbed, _ = redact_texts(user, texts)
    for item, (arguments, question, choices) in zip(items, scrubbed):
        item["arguments"], item["question"], item["choices"] = arguments, question, choices
    return items


def inbox_count(user) -> int:
    """How many items wait for ``user`` (the "Needs you" count): one query per kind."""
    holds = HeldDelivery.objects.filter(
        status=HoldStatus.PENDING, project_id__in=project_ids_with(user, DECIDE_HOLDS),
        sender_session_id__in=visible_session_ids(user)).count()
    return decidable_asks(user).filter(status=AskStatus.PENDING).count() + holds
