"""Sending one attempt of a webhook delivery, in a django-q2 worker.

Claim the attempt (``collab.services.webhooks.claim_delivery``: a conditional UPDATE, so no
other worker sends it too), sign the stored body, POST it through ``collab.outbound`` (the
operator's host list checked again, the address pinned, no redirect followed, bounded time),
and record how it went. No database transaction is held while the request is in flight.
"""

import time

from django.conf import settings

from collab import outbound
from collab.services.webhooks import claim_delivery, delivery_body, record_attempt, signed_headers


def deliver(delivery_id: str) -> str | None:
    """One attempt; returns the delivery's new status, or None if there was nothing to send."""
    delivery = claim_delivery(delivery_id)
    if delivery is None:
        return None
    webhook = delivery.webhook
    if not webhook.active:  # turned off between the hand-off and the claim
        return record_attempt(delivery, outbound.Answer(None, False, "webhook_inactive",
                                                        "the webhook was turned off before this attempt"))
    body = delivery_body(delivery)
    headers = signed_headers(delivery, body, str(int(time.time())))
    answer = outbound.post(webhook.url, body, headers, rules=settings.TRELLIS_WEBHOOK_HOSTS,
                           timeout=settings.TRELLIS_WEBHOOK_TIMEOUT)
    return record_attempt(delivery, answer)
