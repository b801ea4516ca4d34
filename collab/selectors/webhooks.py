"""A project's webhooks and their deliveries, as the API and the project page show them.
Callers authorized the project or webhook (``project.webhooks``)."""

from django.db.models import OuterRef, Subquery

from collab.models import DeliveryStatus, Webhook, WebhookDelivery

MAX_DELIVERIES = 200


def webhooks_of(project):
    """The project's webhooks, oldest first, each with ``last_status`` and ``last_delivery_at``
    of its newest delivery (one query)."""
    newest = WebhookDelivery.objects.filter(webhook=OuterRef("pk")).order_by("-created_at", "-id")
    return (Webhook.objects.filter(project=project)
            .annotate(last_status=Subquery(newest.values("status")[:1]),
                      last_delivery_at=Subquery(newest.values("created_at")[:1]))
            .order_by("created_at", "id"))


def deliveries_of(webhook, *, status: str | None = None, limit: int = 50):
    """The webhook's deliveries, newest first (``status`` one of ``DeliveryStatus`` or None)."""
    rows = WebhookDelivery.objects.filter(webhook=webhook)
    if status:
        rows = rows.filter(status=status)
    return rows.order_by("-created_at", "-id")[: max(1, min(limit, MAX_DELIVERIES))]


def webhook_shape(webhook) -> dict:
    """A webhook as the API answers it: never its secret."""
    return {
        "id": webhook.pk,
        "project": webhook.project.slug,
        "url": webhook.url,
        "description": webhook.description,
        "active": webhook.active,
        "created_at": webhook.created_at,
        "updated_at": webhook.updated_at,
        "secret_rotated_at": webhook.secret_rotated_at,
        "last_status": getattr(webhook, "last_status", None),
        "last_delivery_at": getattr(webhook, "last_delivery_at", None),
    }


def delivery_shape(delivery) -> dict:
    """A delivery: what was sent and how each attempt went (status codes and Trellis's own
    reasons; never the receiver's answer text)."""
    return {
        "id": delivery.pk,
        "webhook": delivery.webhook_id,
        "event": delivery.event,
        "execution": delivery.job_id,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "max_attempts": delivery.max_attempts,
        "next_attempt_at": delivery.next_attempt_at if delivery.status == DeliveryStatus.PENDING else None,
        "last_attempt_at": delivery.last_attempt_at,
        "last_status_code": delivery.last_status_code,
        "last_error_code": delivery.last_error_code,
        "last_error": delivery.last_error,
        "history": delivery.history,
        "delivered_at": delivery.delivered_at,
        "created_at": delivery.created_at,
        "payload": delivery.payload,
    }
