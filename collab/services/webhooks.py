"""Project webhooks: registered by maintainers, notified when an execution ends.

- **Registering** (``do_create_webhook`` / ``do_update_webhook`` / ``do_delete_webhook`` /
  ``do_rotate_webhook_secret``): maintainers and owners (``project.webhooks``, checked by
  ``collab.access``), audited as project events that name the webhook and its host — never
  its URL (which may itself be a credential) nor its secret. The URL's host must be on the
  operator's ``TRELLIS_WEBHOOK_HOSTS`` (``collab.conf.webhook_hosts.check_webhook_url``). The
  secret is generated here and returned by the create and rotate calls only.
- **Owing** (``owe_webhook_deliveries``): the completion transaction of every execution
  (``collab.services.execution.finish_job``) writes one ``WebhookDelivery`` per active
  webhook of its project, body included, and hands each to the queue after commit; a
  crash after the commit loses nothing, the reconciler hands it off again.
- **Sending** (``claim_delivery`` → ``collab.runtime.webhooks`` sends → ``record_attempt``):
  a conditional UPDATE claims the next attempt for one worker, so two workers never send
  the same attempt; the outcome is written only by the claim's holder. A failed attempt that
  may be retried waits ``TRELLIS_WEBHOOK_RETRY_BASE_SECONDS × 2^(n-1)`` (at most an hour,
  ±10 %) on the database clock; ``hand_off_due_deliveries`` (from the reconciler, every
  ``TRELLIS_RECONCILE_SECONDS``) gives due ones to the queue, and takes back attempts whose
  worker died mid-send. Delivery is therefore *at least once*: receivers deduplicate by
  ``X-Trellis-Delivery``.
"""

import hashlib
import hmac
import json
import random
import secrets
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from accounts.models import Project
from collab.brokers import hand_to_broker
from collab.errors import Conflict, Invalid
from collab.events import record_project_event
from collab.models import DeliveryEvent, DeliveryStatus, Job, Session, Webhook, WebhookDelivery
from collab.selectors.inbox import ask_payload
from collab.selectors.shapes import execution_shape
from collab.text import clean_text
from collab.conf.webhook_hosts import DEFAULT_PORTS, WebhookUrlError, check_webhook_url

DELIVER_WEBHOOK = "collab.tasks.deliver_webhook"
MAX_WEBHOOKS_PER_PROJECT = 10
MAX_DESCRIPTION = 200
SECRET_PREFIX = "whsec_"
MAX_RETRY_DELAY = 3600
SIGNATURE_VERSION = "v1"
HAND_OFF_BATCH = 200


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def check_url(url) -> str:
    """The URL if a webhook may call it now (the operator's host list), else ``Invalid`` with
    code ``invalid_webhook_url`` or ``webhook_host_not_allowed``."""
    try:
        check_webhook_url(url, settings.TRELLIS_WEBHOOK_HOSTS)
    except WebhookUrlError as exc:
        raise Invalid(exc.detail, code=exc.code) from None
    return url


def host_of(url: str) -> str:
    """What the audit log says of a (checked) URL: its host and port, never its path or query."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), '')}"


def _description(value) -> str:
    value = clean_text(value or "").strip()
    if len(value) > MAX_DESCRIPTION:
        raise Invalid(f"description must be at most {MAX_DESCRIPTION} characters", code="invalid_description")
    return value


def _lock_project(project_id: int) -> Project:
    return Project.objects.select_for_update(no_key=True).get(pk=project_id)


def do_create_webhook(actor, project: Project, *, url: str, description: str = "", active: bool = True):
    """A new webhook for ``project``: (webhook, secret). The secret is in this answer only.
    Precondition: ``project`` came from ``access_project(…, "project.webhooks")``."""
    url = check_url(url)
    description = _description(description)
    try:
        with transaction.atomic():
            _lock_project(project.pk)  # the count below cannot be overtaken
            if Webhook.objects.filter(project_id=project.pk).count() >= MAX_WEBHOOKS_PER_PROJECT:
                raise Invalid(f"a project has at most {MAX_WEBHOOKS_PER_PROJECT} webhooks", code="webhook_limit")
            secret = new_secret()
            webhook = Webhook.objects.create(project=project, url=url, description=description, active=bool(active),
                                             secret=secret, created_by=actor)
            record_project_event(project.pk, "webhook.created",
                                 {"webhook": webhook.pk, "host": host_of(url), "active": webhook.active}, actor=actor)
    except IntegrityError:
        raise Conflict("this project already has a webhook with that url", code="webhook_exists") from None
    webhook.refresh_from_db()
    return webhook, secret


def do_update_webhook(actor, webhook: Webhook, *, url=None, description=None, active=None) -> Webhook:
    """Change the URL, description or active flag (only what is given). Turning a webhook off
    gives up its pending deliveries (``webhook_inactive``). Precondition: from ``access_webhook``."""
    changes = {}
    if url is not None:
        changes["url"] = check_url(url)
    if description is not None:
        changes["description"] = _description(description)
    if active is not None:
        changes["active"] = bool(active)
    try:
        with transaction.atomic():
            _lock_project(webhook.project_id)
            current = Webhook.objects.select_for_update(no_key=True).get(pk=webhook.pk)
            changed = {k: v for k, v in changes.items() if getattr(current, k) != v}
            if changed:
                for field, value in changed.items():
                    setattr(current, field, value)
                current.save(update_fields=[*changed, "updated_at"])
                audit = {k: v for k, v in changed.items() if k != "url"}
                if "url" in changed:
                    audit["host"] = {"from": host_of(webhook.url), "to": host_of(changed["url"])}
                record_project_event(webhook.project_id, "webhook.updated", {"webhook": webhook.pk, **audit},
                                     actor=actor)
            if changed.get("active") is False:
                give_up_pending(current, "webhook_inactive", "the webhook was turned off before this attempt")
    except IntegrityError:
        raise Conflict("this project already has a webhook with that url", code="webhook_exists") from None
    return current


def do_delete_webhook(actor, webhook: Webhook) -> None:
    """Delete the webhook and its deliveries (an attempt in flight finishes and records nothing)."""
    with transaction.atomic():
        _lock_project(webhook.project_id)
        deleted, _ = Webhook.objects.filter(pk=webhook.pk).delete()
        if deleted:
            record_project_event(webhook.project_id, "webhook.deleted",
                                 {"webhook": webhook.pk, "host": host_of(webhook.url)}, actor=actor)


def do_rotate_webhook_secret(actor, webhook: Webhook) -> tuple[Webhook, str]:
    """A new secret, returned once; every attempt from now on is signed with it (the old one
    stops working at once: rotate when the receiver is ready for the new one)."""
    with transaction.atomic():
        _lock_project(webhook.project_id)
        secret = new_secret()
        updated = Webhook.objects.filter(pk=webhook.pk).update(secret=secret, secret_rotated_at=Now(),
                                                                updated_at=timezone.now())
        if updated:
            record_project_event(webhook.project_id, "webhook.secret_rotated", {"webhook": webhook.pk}, actor=actor)
    webhook.refresh_from_db()
    return webhook, secret


def give_up_pending(webhook: Webhook, code: str, reason: str) -> int:
    return WebhookDelivery.objects.filter(webhook=webhook, status=DeliveryStatus.PENDING).update(
        status=DeliveryStatus.FAILED, next_attempt_at=None, last_error_code=code, last_error=reason,
    )


# --- owing -----------------------------------------------------------------------------------


def delivery_payload(delivery_id: str, job: Job, project: Project, session_title: str) -> dict:
    """The body of an ``execution.finished`` notice: which execution of which project and
    session ended, and how (the execution as ``GET /api/executions/{id}`` shows it)."""
    body = {
        "id": delivery_id,
        "type": DeliveryEvent.EXECUTION_FINISHED.value,
        "project": {"slug": project.slug, "name": project.name},
        "session": {"id": job.session_id, "title": session_title},
        "execution": execution_shape(job),
    }
    return json.loads(json.dumps(body, cls=DjangoJSONEncoder))


def owe_webhook_deliveries(job: Job, project: Project | None = None, session: Session | None = None, *,
                           any_active: bool = True) -> list[str]:
    """One delivery per active webhook of the job's project, for the job that just ended.

    Precondition: inside the completion transaction, after the job's terminal state was
    written and read back (``finish_job``). Costs one indexed read when the project has no
    webhook, none when ``any_active`` is False (the completion asked already, in its one
    statement about what waits: a webhook created since is one created after this completion).
    Handed to the queue after commit; the unique (webhook, job, event) index makes a second
    call for the same job write nothing."""
    if not any_active:
        return []
    webhooks = active_webhooks_key_shared(job.project_id)
    if not webhooks:
        return []
    project = project or job.project  # the completion passes the rows it holds: no reads again
    if session is None:
        session = Session.objects.only("title").get(pk=job.session_id)
    title = session.title
    owed = set(WebhookDelivery.objects.filter(job_id=job.pk, webhook__in=webhooks, event=DeliveryEvent.EXECUTION_FINISHED)
               .values_list("webhook_id", flat=True))
    created = []
    for webhook in webhooks:
        if webhook.pk in owed:
            continue
        delivery = WebhookDelivery(webhook=webhook, project_id=job.project_id, job_id=job.pk,
                                   max_attempts=settings.TRELLIS_WEBHOOK_MAX_ATTEMPTS,
                                   next_attempt_at=Now(), handed_off_at=Now())
        delivery.payload = delivery_payload(delivery.pk, job, project, title)
        delivery.save(force_insert=True)
        created.append(delivery.pk)
    for pk in created:
        enqueue_delivery(pk)
    return created


def owe_ask_deliveries(ask, event: str) -> list[str]:
    """One delivery per active webhook of the ask's project for ``event`` (``ask.requested`` when
    a turn starts waiting for a person, ``ask.decided`` when someone decided): the body names the
    ask as the inbox shows it and the execution as ``GET /api/executions/{id}`` does. Inside the
    transaction that wrote the ask's change; handed to the queue after commit, as an execution's
    end is. One read when the project has no webhook."""
    webhooks = active_webhooks_key_shared(ask.project_id)
    if not webhooks:
        return []
    job = Job.objects.select_related("session", "project").get(pk=ask.job_id)
    created = []
    for webhook in webhooks:
        delivery = WebhookDelivery(webhook=webhook, project_id=ask.project_id, job_id=ask.job_id, ask_id=ask.pk,
                                   event=event, max_attempts=settings.TRELLIS_WEBHOOK_MAX_ATTEMPTS,
                                   next_attempt_at=Now(), handed_off_at=Now())
        body = {"id": delivery.pk, "type": event, "project": {"slug": job.project.slug, "name": job.project.name},
                "session": {"id": job.session_id, "title": job.session.title},
                "ask": {**ask_payload(ask), "status": ask.status,
                        "decided_by": ask.decided_by.username if ask.decided_by_id else None},
                "execution": execution_shape(job)}
        delivery.payload = json.loads(json.dumps(body, cls=DjangoJSONEncoder))
        try:
            with transaction.atomic():
                delivery.save(force_insert=True)
        except IntegrityError:  # owed already (a retried transaction)
            continue
        created.append(delivery.pk)
    for pk in created:
        enqueue_delivery(pk)
    return created


def active_webhooks_key_shared(project_id: int) -> list[Webhook]:
    """The project's active webhooks, each held against deletion until this transaction ends.

    On PostgreSQL ``FOR KEY SHARE``: the lock the deliveries' foreign key check takes at
    commit, taken now, so a webhook deleted meanwhile cannot fail the completion transaction
    that owes it a delivery. It never waits for, nor blocks, another completion or an edit of
    the webhook (only its deletion waits). On SQLite the transaction holds the database."""
    rows = Webhook.objects.filter(project_id=project_id, active=True).order_by("created_at", "id")
    if connection.vendor != "postgresql":
        return list(rows)
    table = Webhook._meta.db_table
    return list(Webhook.objects.raw(
        f'SELECT * FROM "{table}" WHERE project_id = %s AND active ORDER BY created_at, id FOR KEY SHARE',
        [project_id]))


def enqueue_delivery(delivery_id: str) -> None:
    """Hand a delivery to a worker with the transaction that owes it (``collab.brokers.hand_to_broker``)."""
    hand_to_broker(DELIVER_WEBHOOK, delivery_id, task_name=f"webhook-{delivery_id}")


# --- sending ---------------------------------------------------------------------------------


def claim_lease() -> timedelta:
    """How long a sending worker holds an attempt: past the whole attempt's deadline."""
    return timedelta(seconds=settings.TRELLIS_WEBHOOK_TIMEOUT * 2 + 30)


def claim_delivery(delivery_id: str) -> WebhookDelivery | None:
    """Take the next attempt of a due delivery for this worker, or None (not due, not pending,
    or another worker won). One conditional UPDATE: two workers never both win an attempt."""
    won = WebhookDelivery.objects.filter(
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=Now(), attempts__lt=F("max_attempts"),
    ).update(status=DeliveryStatus.SENDING, attempts=F("attempts") + 1, claimed_until=Now() + claim_lease(),
             last_attempt_at=Now(), next_attempt_at=None)
    if not won:
        return None
    return WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): base × 2^(attempt-1), at most
    an hour, ±10 %."""
    base = settings.TRELLIS_WEBHOOK_RETRY_BASE_SECONDS
    return min(MAX_RETRY_DELAY, base * 2 ** min(attempt - 1, 20)) * random.uniform(0.9, 1.1)


def record_attempt(delivery: WebhookDelivery, answer) -> str:
    """Write how the claimed attempt went; returns the delivery's new status. Written only if
    this worker still holds the attempt (status ``sending`` at this attempt number)."""
    attempt = delivery.attempts
    entry = {"attempt": attempt, "at": timezone.now().isoformat(), "status_code": answer.status,
             "error_code": answer.code}
    fields = {"claimed_until": None, "last_status_code": answer.status, "last_error_code": answer.code,
              "last_error": clean_text(answer.reason)[:300], "history": [*delivery.history, entry]}
    if answer.ok:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=Now())
    elif answer.retryable and attempt < delivery.max_attempts:
        fields.update(status=DeliveryStatus.PENDING, handed_off_at=None,
                      next_attempt_at=Now() + timedelta(seconds=retry_delay(attempt)))
    else:
        fields.update(status=DeliveryStatus.FAILED)
    WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.SENDING, attempts=attempt).update(**fields)
    return fields["status"]


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=`` + hex HMAC-SHA256 of ``timestamp + "." + body`` under the webhook's secret."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={mac}"


def delivery_body(delivery: WebhookDelivery) -> bytes:
    return json.dumps(delivery.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signed_headers(delivery: WebhookDelivery, body: bytes, timestamp: str) -> dict:
    return {
        "Content-Type": "application/json",
        "User-Agent": "Trellis-Webhooks/1",
        "X-Trellis-Event": delivery.event,
        "X-Trellis-Delivery": delivery.pk,
        "X-Trellis-Attempt": str(delivery.attempts),
        "X-Trellis-Timestamp": timestamp,
        "X-Trellis-Signature": signature(delivery.webhook.secret, timestamp, body),
    }


def hand_off_due_deliveries() -> dict:
    """The reconciler's part (every ``TRELLIS_RECONCILE_SECONDS``): attempts whose worker died
    mid-send (lease past) become due again — or fail when out of attempts; due deliveries not
    handed to the queue since their last failure (or for a lease: a hand-off lost with a dead
    process) are handed off, each once (a conditional UPDATE), however many reconcile at once."""
    taken_back = []
    for pk, attempts, max_attempts in (
        WebhookDelivery.objects.filter(status=DeliveryStatus.SENDING, claimed_until__lt=Now())
        .values_list("pk", "attempts", "max_attempts")[:HAND_OFF_BATCH]
    ):
        lost = {"last_status_code": None, "last_error_code": "webhook_worker_lost",
                "last_error": "the worker sending this attempt stopped before it recorded the answer",
                "claimed_until": None}
        if attempts >= max_attempts:
            lost.update(status=DeliveryStatus.FAILED)
        else:
            lost.update(status=DeliveryStatus.PENDING, next_attempt_at=Now(), handed_off_at=None)
        if WebhookDelivery.objects.filter(pk=pk, status=DeliveryStatus.SENDING, attempts=attempts,
                                          claimed_until__lt=Now()).update(**lost):
            taken_back.append(pk)
    stale = Now() - timedelta(seconds=settings.TRELLIS_LEASE_SECONDS)
    not_handed = Q(handed_off_at__isnull=True) | Q(handed_off_at__lt=stale)
    handed = []
    for pk in list(WebhookDelivery.objects.filter(not_handed, status=DeliveryStatus.PENDING, next_attempt_at__lte=Now())
                   .order_by("next_attempt_at").values_list("pk", flat=True)[:HAND_OFF_BATCH]):
        with transaction.atomic():
            if WebhookDelivery.objects.filter(not_handed, pk=pk, status=DeliveryStatus.PENDING).update(handed_off_at=Now()):
                enqueue_delivery(pk)
                handed.append(pk)
    return {"webhooks_taken_back": taken_back, "webhooks_handed_off": handed}
