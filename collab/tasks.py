"""django-q2 task entry points: load ids, call the runtime. Nothing else lives here."""

from django.db import close_old_connections

from collab.runtime.loop import hand_to_slot
from collab.runtime.naming import auto_name_branch
from collab.runtime.webhooks import deliver
from collab.services.notify import send_ask_email
from collab.services.reconcile import reconcile as run_reconcile


def run_turn(job_id: str) -> str | None:
    """Hand the turn to one of this process's slots (collab.runtime.slots); returns once it runs there."""
    close_old_connections()
    try:
        return hand_to_slot(job_id)
    finally:
        close_old_connections()


def name_branch(branch_id: str) -> None:
    close_old_connections()
    try:
        auto_name_branch(branch_id)
    finally:
        close_old_connections()


def reconcile() -> dict:
    close_old_connections()
    try:
        return run_reconcile()
    finally:
        close_old_connections()


def deliver_webhook(delivery_id: str) -> str | None:
    close_old_connections()
    try:
        return deliver(delivery_id)
    finally:
        close_old_connections()


def notify_ask(ask_id: str) -> int:
    close_old_connections()
    try:
        return send_ask_email(ask_id)
    finally:
        close_old_connections()
